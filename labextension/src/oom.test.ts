import { describe, expect, it } from 'vitest';

import { holderCells, LogEvent, newOOMs, OOMEvent, reportLines, stackLine, timelineData } from './oom';

const GiB = 1024 ** 3;

function oomEvent(over: Partial<OOMEvent> = {}): OOMEvent {
  return {
    seq: 4,
    time: 1000,
    kernel_id: 'k-self-0001',
    connection_file: '/rt/kernel-k-self-0001.json',
    notebook: '/home/a/train.ipynb',
    name: 'train.ipynb',
    user: 'a',
    framework: 'torch',
    error: 'torch.OutOfMemoryError',
    message: 'CUDA out of memory.',
    requested_bytes: 20 * GiB,
    cell: { execution_count: 7, line: 3, source: 'y = model(x)' },
    kernel: {
      allocated_bytes: 8 * GiB,
      reserved_bytes: 10 * GiB,
      releasable_bytes: GiB,
      fragmented_bytes: GiB,
      cached_bytes: 2 * GiB,
      ipython_bytes: 2 * GiB,
      ipython_refs: ['Out[5]'],
      traceback_bytes: 0
    },
    gpu: { index: 0, name: 'H200', total_bytes: 80 * GiB, used_bytes: 79 * GiB, free_bytes: GiB, simulated: true },
    holders: [
      { kind: 'user', name: 'user b', user: 'b', bytes: 60 * GiB, notebooks: 1 },
      { kind: 'notebook', name: 'this kernel', self: true, user: 'a', bytes: 10 * GiB, state: 'busy', pids: [10] },
      { kind: 'notebook', name: '/home/a/eval.ipynb', user: 'a', bytes: 5 * GiB, state: 'idle', idle_seconds: 600 },
      { kind: 'process', name: 'pid 9 (a)', user: 'a', bytes: GiB, pid: 9, command: '/usr/bin/python3 serve.py', pids: [9] }
    ],
    sampled_at: 999_000,
    advice: "user b's notebook, idle 1 h, holds 60.0 GiB of GPU 0: ask b",
    headline: "Out of memory in train.ipynb on GPU 0: 60.0 GiB held by user b's idle notebook",
    ...over
  };
}

describe('newOOMs', () => {
  it('takes each out-of-memory event once and nothing else', () => {
    const seen = new Set<number>();
    const events: LogEvent[] = [
      { seq: 3, kind: 'reclaim', kernel_id: 'k', notebook: '', reason: 'restart' },
      { seq: 4, kind: 'oom', kernel_id: 'k', notebook: '', reason: 'x', oom: oomEvent() },
      { seq: 5, kind: 'oom', kernel_id: 'k', notebook: '', reason: 'no payload' }
    ];
    expect(newOOMs(events, seen).map(e => e.seq)).toEqual([4]);
    expect(newOOMs(events, seen)).toEqual([]);
  });
});

describe('holderCells', () => {
  it("shows the daemon's holders by the names it gave them, in its order", () => {
    expect(holderCells(oomEvent())).toEqual([
      ['user b', 'b', '60.0 GiB', ''],
      ['this kernel', 'a', '10.0 GiB', 'busy'],
      ['/home/a/eval.ipynb', 'a', '5.0 GiB', 'idle 10 min'],
      ['pid 9 (a)', 'a', '1.0 GiB', '']
    ]);
  });
});

describe('reportLines', () => {
  it('says what was asked, where, and what the kernel and the GPU hold', () => {
    expect(reportLines(oomEvent())).toEqual([
      'train.ipynb, cell [7], line 3: asked for 20.0 GiB (torch.OutOfMemoryError)',
      'y = model(x)',
      'this kernel: 8.0 GiB allocated, 2.0 GiB cached (1.0 GiB releasable, 1.0 GiB fragmented)',
      'held only by IPython: 2.0 GiB (Out[5])',
      'GPU 0 H200 (simulated): 79.0 GiB of 80.0 GiB used, 1.0 GiB free'
    ]);
  });
  it("shows the daemon's cached figure and name, never its own", () => {
    const ev = oomEvent({ name: 'kernel k-self-0' });
    ev.kernel = { ...ev.kernel, cached_bytes: 3 * GiB };
    expect(reportLines(ev).slice(0, 3)).toEqual([
      'kernel k-self-0, cell [7], line 3: asked for 20.0 GiB (torch.OutOfMemoryError)',
      'y = model(x)',
      'this kernel: 8.0 GiB allocated, 3.0 GiB cached (1.0 GiB releasable, 1.0 GiB fragmented)'
    ]);
  });
  it('works without a cell, a request or a GPU', () => {
    const ev = oomEvent({ cell: {}, requested_bytes: 0, gpu: null, notebook: '', name: 'kernel k-self-0' });
    ev.kernel = { ...ev.kernel, ipython_bytes: 0, reserved_bytes: 8 * GiB, cached_bytes: 0 };
    expect(reportLines(ev)).toEqual([
      'kernel k-self-0: asked for an unknown amount (torch.OutOfMemoryError)',
      'this kernel: 8.0 GiB allocated, 0 B cached'
    ]);
  });
});

describe('snapshots', () => {
  it('names a stack by where it asked', () => {
    const f = (filename: string, line: number, name: string) => ({ filename, line, name });
    expect(stackLine({ frames: [f('/x/torch/nn/linear.py', 1, 'forward')], where: f('/tmp/ipykernel_1/2.py', 5, '<module>') })).toBe(
      '2.py:5 in <module>'
    );
    expect(stackLine({ frames: [f('/x/a.py', 9, 'g')] })).toBe('a.py:9 in g');
    expect(stackLine(undefined)).toBe('(no Python frame)');
  });
  it('puts the timeline in seconds from its start', () => {
    expect(timelineData({ time_us: [5_000_000, 6_500_000], allocated: [1, 2], reserved: [3, 4] })).toEqual([
      [0, 1.5],
      [1, 2],
      [3, 4]
    ]);
  });
});
