// The ranks of an Engine (or of a bare TpGroup) as a Scheduler runs on them: every rank's
// forward pass, KV pool, communicator and first KV head, and the call that steps them all.
#pragma once

#include "worker/runtime/engine.h"
#include "worker/runtime/tp/tp_group.h"
#include "worker/serving/scheduler.h"

namespace recall::serving {

// The group must outlive the scheduler; its forward passes must have been created with the
// scheduler's max_batch_tokens (runtime::tp::TpGroupOptions::forward).
SchedulerRanks SchedulerRanksOf(runtime::tp::TpGroup& group);

// The engine must outlive the scheduler; its forward passes must take the scheduler's
// max_batch_tokens (EngineOptions::forward).
SchedulerRanks SchedulerRanksOf(runtime::Engine& engine);

}  // namespace recall::serving
