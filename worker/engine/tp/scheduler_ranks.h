// The ranks of a TpGroup as a Scheduler runs on them: every rank's forward pass, KV pool,
// communicator and first KV head, and TpGroup::Run to step them together.
#pragma once

#include "worker/engine/scheduler.h"
#include "worker/engine/tp/tp_group.h"

namespace recall::engine::tp {

// The group must outlive the scheduler; its forward passes must have been created with the
// scheduler's max_batch_tokens (TpGroupOptions::forward).
SchedulerRanks SchedulerRanksOf(TpGroup& group);

}  // namespace recall::engine::tp
