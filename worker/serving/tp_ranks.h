// The ranks of a TpGroup as a Scheduler runs on them: every rank's forward pass, KV pool,
// communicator and first KV head, and runtime::tp::TpGroup::Run to step them together.
#pragma once

#include "worker/runtime/tp/tp_group.h"
#include "worker/serving/scheduler.h"

namespace recall::serving {

// The group must outlive the scheduler; its forward passes must have been created with the
// scheduler's max_batch_tokens (runtime::tp::TpGroupOptions::forward).
SchedulerRanks SchedulerRanksOf(runtime::tp::TpGroup& group);

}  // namespace recall::serving
