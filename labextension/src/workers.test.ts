import { describe, expect, it } from 'vitest';

import { GiB, nb } from './test-fixtures';
import { busyLines, choiceOf, pidsToConfirm, planFreeWorkers } from './workers';

function withWorkers(...workers: { pid: number; gpu?: number; util?: { sm_percent: number; memory_percent: number } }[]) {
  const n = nb('k', 4 * GiB);
  for (const w of workers) {
    n.processes.push({ pid: w.pid, per_gpu: [{ index: w.gpu ?? 0, bytes: GiB, ...(w.util ? { utilization: w.util } : {}) }] });
  }
  return n;
}

describe('planFreeWorkers', () => {
  it('asks about nothing when every worker is idle: the idle ones are freed at once', () => {
    const plan = planFreeWorkers(withWorkers({ pid: 201, util: { sm_percent: 0, memory_percent: 0 } }));
    expect(plan).toEqual({ busy: [], workers: [201] });
    expect(pidsToConfirm(plan, 'idle')).toEqual([]);
  });

  it('names a computing worker with its SM %, and a worker whose work is unknown', () => {
    const plan = planFreeWorkers(
      withWorkers(
        { pid: 201, util: { sm_percent: 90, memory_percent: 5 } },
        { pid: 202, util: { sm_percent: 0, memory_percent: 0 } },
        { pid: 203, gpu: 1 },
        { pid: 204, util: { sm_percent: 0, memory_percent: 40 } }
      )
    );
    expect(plan.busy).toEqual([
      { pid: 201, gpus: [0], sm: 90, mem: 5 },
      { pid: 203, gpus: [1] },
      { pid: 204, gpus: [0], sm: 0, mem: 40 }
    ]);
    expect(busyLines(plan.busy)).toEqual([
      'pid 201 computes at 90% SM on GPU 0',
      'pid 203: whether it computes on GPU 1 is unknown',
      'pid 204 computes on GPU 0 (0% SM, 40% memory just now)'
    ]);
  });

  it('never counts the kernel itself, however busy', () => {
    const n = withWorkers({ pid: 201, util: { sm_percent: 0, memory_percent: 0 } });
    n.processes[0].per_gpu[0].utilization = { sm_percent: 100, memory_percent: 100 };
    expect(planFreeWorkers(n)).toEqual({ busy: [], workers: [201] });
  });

  it('has nothing to ask without the notebook', () => {
    expect(planFreeWorkers(undefined)).toEqual({ busy: [], workers: [] });
  });
});

describe('pidsToConfirm', () => {
  const plan = planFreeWorkers(
    withWorkers({ pid: 201, util: { sm_percent: 90, memory_percent: 0 } }, { pid: 202, util: { sm_percent: 0, memory_percent: 0 } })
  );
  it('confirms every worker when the user ends the busy ones too', () => {
    expect(pidsToConfirm(plan, 'all')).toEqual([201, 202]);
  });
  it('confirms none when the user frees the idle ones only: the daemon leaves the busy ones', () => {
    expect(pidsToConfirm(plan, 'idle')).toEqual([]);
  });
  it('sends nothing when the user cancels', () => {
    expect(pidsToConfirm(plan, 'cancel')).toBeNull();
  });
});

describe('choiceOf', () => {
  it('reads the dialog: cancel sends nothing, the ok button frees the idle only, the warn button ends them too', () => {
    expect(choiceOf({ accept: false, displayType: 'default' })).toBe('cancel');
    expect(choiceOf({ accept: true, displayType: 'default' })).toBe('idle');
    expect(choiceOf({ accept: true, displayType: 'warn' })).toBe('all');
  });
});
