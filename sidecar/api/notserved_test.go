package api

import (
	"context"
	"encoding/json"
	"io"

	"github.com/gpumem/gpumem/sidecar/oom"
)

// fakeBackend serves none of what the tests' other backends add (they
// embed it and override what they serve): ErrNotServed, answered 404.

func (b *fakeBackend) ReportJSON(context.Context) ([]byte, error) { return nil, ErrNotServed }

func (b *fakeBackend) History(context.Context, HistoryQuery) (HistoryResponse, error) {
	return HistoryResponse{}, ErrNotServed
}

func (b *fakeBackend) KernelVars(context.Context, KernelRef, bool) (json.RawMessage, error) {
	return nil, ErrNotServed
}

func (b *fakeBackend) KernelSummary(context.Context, KernelRef) (json.RawMessage, error) {
	return nil, ErrNotServed
}

func (b *fakeBackend) KernelWhy(context.Context, KernelRef, WhyQuery) (json.RawMessage, error) {
	return nil, ErrNotServed
}

func (b *fakeBackend) JoinWhy(context.Context, KernelRef, json.RawMessage) (json.RawMessage, error) {
	return nil, ErrNotServed
}

func (b *fakeBackend) FreeChildren(context.Context, KernelRef, bool, FreeChildrenRequest) (json.RawMessage, error) {
	return nil, ErrNotServed
}

func (b *fakeBackend) ChildrenBefore(context.Context, KernelRef) (json.RawMessage, error) {
	return nil, ErrNotServed
}

func (b *fakeBackend) EndOrphans(context.Context, KernelRef, string, EndOrphansRequest) (EndOrphansReply, error) {
	return EndOrphansReply{}, ErrNotServed
}

func (b *fakeBackend) KeepKernel(context.Context, KernelRef) (KeepReply, error) {
	return KeepReply{}, ErrNotServed
}

func (b *fakeBackend) RecordOOM(context.Context, KernelRef, oom.Request) (oom.Event, error) {
	return oom.Event{}, ErrNotServed
}

func (b *fakeBackend) OOMEvents(context.Context) ([]oom.Event, error) { return nil, ErrNotServed }

func (b *fakeBackend) AddSnapshot(context.Context, KernelRef, uint32, SnapshotRequest) (SnapshotInfo, error) {
	return SnapshotInfo{}, ErrNotServed
}

func (b *fakeBackend) Snapshots(context.Context, KernelRef) ([]SnapshotInfo, error) {
	return nil, ErrNotServed
}

func (b *fakeBackend) MemorySnapshot(context.Context, KernelRef, string) (SnapshotInfo, json.RawMessage, error) {
	return SnapshotInfo{}, nil, ErrNotServed
}

func (b *fakeBackend) SnapshotFile(context.Context, KernelRef, string) (io.ReadSeeker, SnapshotInfo, error) {
	return nil, SnapshotInfo{}, ErrNotServed
}
