// RunTurnReactor: one RunTurn call (proto/recall/v1/worker.proto) on gRPC's callback API.
//
// It streams a turn the scheduler has accepted. The turn's TurnStream calls the reactor's
// listener when an update is ready; the reactor then starts a write if none is in flight,
// and each OnWriteDone starts the next, taking everything pending at once: a slow reader
// gets coalesced tokens and never slows the batch, and no thread waits for tokens.
//
// One Finish path (Pump): the call is finished once its end is known and nothing is left to
// write. The end is the turn's own (TurnDone, or its error status, after a HistoryNeeded
// event when the worker lacks the session), or CANCELLED when the client cancels (OnCancel)
// or a write fails; both abort the scheduler's turn without waiting for the engine thread,
// which ends it and frees its blocks before its next step.
//
// Thread safety: reactions and the listener (on the engine thread) may run concurrently;
// state is guarded by one mutex, never held while calling gRPC or the scheduler.
//
// Lifetime: gRPC holds the reactor from Start until OnDone. The listener holds a weak_ptr, so
// a listener call running on the engine thread when OnDone comes keeps the reactor alive
// until it returns; after Finish, listener calls do nothing.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "recall/v1/worker.pb.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/turn_stream.h"

namespace recall::service {

class RunTurnReactor final : public grpc::ServerWriteReactor<v1::TurnEvent> {
 public:
  // `stream`: what Scheduler::Submit answered for the turn with `request_id`; an error
  // finishes the call with it. `history_length` is the request's, for a HistoryNeeded event.
  // Returns the reactor to hand to gRPC.
  static grpc::ServerWriteReactor<v1::TurnEvent>* Start(
      serving::Scheduler& scheduler, std::string request_id, int history_length,
      absl::StatusOr<std::shared_ptr<serving::TurnStream>> stream);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  RunTurnReactor(serving::Scheduler& scheduler, std::string request_id, int history_length);

  // Starts the next write, or finishes the call; does nothing while a write is in flight.
  void Pump();
  // Moves the stream's pending update, if any, into events_ and end_.
  void TakeUpdate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the call with CANCELLED (unless its end is known) and aborts the turn.
  void Stop(const char* why);

  serving::Scheduler& scheduler_;
  const std::string request_id_;
  const int history_length_;
  std::shared_ptr<RunTurnReactor> self_;  // gRPC's reference, dropped in OnDone

  absl::Mutex mu_;
  std::shared_ptr<serving::TurnStream> stream_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::TurnEvent> events_ ABSL_GUARDED_BY(mu_);  // taken, not yet written
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);   // the call's status, once known
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  v1::TurnEvent write_;  // the write in flight (only touched while writing_)
};

}  // namespace recall::service
