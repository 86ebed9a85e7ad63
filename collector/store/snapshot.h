// The fleet's state (ingest/fleet_state.h) as the state directory holds it
// (state.proto): a snapshot, and the journal records applied after it.
//
// Free functions. StateToProto and StateFromProto touch only their
// arguments; TakeSnapshot, RestoreSnapshot and ReplayRecord go through the
// Ingestor's lock and are as thread-safe as it is.
#pragma once

#include "collector/ingest/fleet_state.h"
#include "collector/ingest/ingestor.h"
#include "common/result.h"
#include "store/state.pb.h"  // generated from collector/store/state.proto

namespace tlsprof::collector {

void StateToProto(const FleetState& state, state::State& out);
// What is derived (the hosts with their own label, the connection series
// count) is rebuilt. An error when the snapshot is not one this collector
// writes (a usage series with the wrong label count, a sequence window of
// the wrong size): corruption, since readers and writers are the same binary.
Result<FleetState> StateFromProto(const state::State& in);

// The Ingestor's state, built under its lock (nothing is applied meanwhile).
void TakeSnapshot(const Ingestor& ingestor, state::State& out);
// Replaces the Ingestor's state by `snapshot` (at start, before serving).
Status RestoreSnapshot(const state::State& snapshot, Ingestor& ingestor);
// Applies a journal record as Submit applied it: an error when it does not
// parse or its report fails ValidateReport (the state directory is input
// too; Apply indexes by what validation checked).
Result<ApplyResult> ReplayRecord(const state::JournalRecord& record, Ingestor& ingestor);

}  // namespace tlsprof::collector
