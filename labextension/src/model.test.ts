import { describe, expect, it } from 'vitest';

import {
  alerts,
  cullWarnings,
  formatDuration,
  frameworkLines,
  History,
  mainGPU,
  newAlerts,
  Notebook,
  notebookLabel,
  smSeries,
  stackNotebooks,
  State,
  tooltipLines,
  varRows
} from './model';

const GiB = 1024 ** 3;

function nb(id: string, bytes: number, gpu = 0, path = `${id}.ipynb`): Notebook {
  return {
    kernel_id: id,
    notebook: `/root/${path}`,
    path,
    pids: [100],
    user: 'ann',
    gpu_memory_bytes: bytes,
    peak_bytes: bytes,
    per_gpu: [{ index: gpu, bytes }],
    processes: [{ pid: 100, per_gpu: [{ index: gpu, bytes }] }]
  };
}

function state(over: Partial<State> = {}): State {
  return {
    status: 'ok',
    now: 1000,
    step_seconds: 1,
    alert_threshold: 0.8,
    gpus: [
      {
        index: 0,
        uuid: 'GPU-0',
        name: 'Simulated H200',
        memory_total_bytes: 80 * GiB,
        memory_used_bytes: 10 * GiB,
        simulated: true,
        notebook_bytes: 10 * GiB,
        other_bytes: 0,
        free_bytes: 70 * GiB
      }
    ],
    notebooks: [],
    others: [],
    warnings: [],
    series: { gpus: [], notebooks: [] },
    events: [],
    last_event: 0,
    ...over
  };
}

describe('History', () => {
  it('merges incremental replies and keeps 15 minutes', () => {
    const h = new History();
    h.merge(state({ now: 1000, series: { gpus: [], notebooks: [{ id: 'a', peak_bytes: 0, peak_at: 0, points: [[999, 1], [1000, 2]] }] } }));
    h.merge(state({ now: 1001, series: { gpus: [], notebooks: [{ id: 'a', peak_bytes: 0, peak_at: 0, points: [[1000, 2], [1001, 3]] }] } }));
    expect([...h.notebooks.get('a')!.entries()]).toEqual([[999, 1], [1000, 2], [1001, 3]]);
    h.merge(state({ now: 1001 + 15 * 60, series: { gpus: [], notebooks: [] } }));
    expect(h.notebooks.has('a')).toBe(false);
  });
});

describe('stackNotebooks', () => {
  it('stacks the biggest at the bottom on a common time axis, gaps as 0', () => {
    const h = new History();
    h.merge(
      state({
        now: 1003,
        series: {
          gpus: [],
          notebooks: [
            { id: 'small', peak_bytes: 0, peak_at: 0, points: [[1002, 1], [1003, 1]] },
            { id: 'big', peak_bytes: 0, peak_at: 0, points: [[1001, 5], [1003, 6]] }
          ]
        }
      })
    );
    const st = stackNotebooks(h, [nb('small', 1), nb('big', 6), nb('elsewhere', 9, 1)], 0, 1, 3);
    expect(st.times).toEqual([1001, 1002, 1003]);
    expect(st.stacks.map(s => s.kernelId)).toEqual(['big', 'small']);
    expect(st.stacks[0].values).toEqual([5, 0, 6]);
    expect(st.stacks[1].values).toEqual([5, 1, 7]);
    expect(st.stacks[1].label).toBe('small.ipynb');
  });
});

describe('alerts', () => {
  const over = state({
    gpus: [{ ...state().gpus[0], memory_used_bytes: 70 * GiB }],
    notebooks: [nb('k1', 40 * GiB, 0, 'train.ipynb'), nb('k2', 5 * GiB, 0, 'eval.ipynb')],
    others: [{ user: 'bob', notebooks: 1, processes: 0, bytes: 25 * GiB, per_gpu: [{ index: 0, bytes: 25 * GiB }] }]
  });

  it('names the biggest holders, other users by user', () => {
    const as = alerts(over, 2);
    expect(as).toHaveLength(1);
    expect(as[0].message).toBe('GPU 0 (Simulated H200) is 88% full: 70.0 GiB of 80.0 GiB. Biggest: train.ipynb 40.0 GiB, user bob 25.0 GiB.');
    expect(as[0].ownKernels).toEqual(['k1', 'k2']);
  });

  it('is quiet under the threshold and with alerts off', () => {
    expect(alerts(state())).toEqual([]);
    expect(alerts({ ...over, alert_threshold: 0 })).toEqual([]);
  });

  it('shows each crossing once', () => {
    const shown = new Set<string>();
    expect(newAlerts(alerts(over), shown)).toHaveLength(1);
    expect(newAlerts(alerts(over), shown)).toHaveLength(0);
    expect(newAlerts(alerts(state()), shown)).toHaveLength(0); // back under
    expect(newAlerts(alerts(over), shown)).toHaveLength(1); // a new crossing
  });
});

describe('labels, tooltip, frameworks, vars', () => {
  it('labels a kernel without a notebook by its id', () => {
    expect(notebookLabel({ notebook: '', kernel_id: '0123456789abcdef' })).toBe('kernel 01234567');
  });

  it('picks the GPU a notebook uses most', () => {
    const s = state({ gpus: [state().gpus[0], { ...state().gpus[0], index: 1, name: 'B' }] });
    const n = { ...nb('k', 3), per_gpu: [{ index: 0, bytes: 1 }, { index: 1, bytes: 2 }] };
    expect(mainGPU(s, n)?.index).toBe(1);
    expect(mainGPU(s, undefined)?.index).toBe(0);
  });

  it('writes per-GPU lines and marks the simulated GPU', () => {
    const s = state({ notebooks: [nb('k', 2 * GiB)] });
    expect(tooltipLines(s, s.notebooks[0])).toEqual([
      "k.ipynb: 2.0 GiB on the GPU (driver's figure, children included)",
      'peak since kernel start: 2.0 GiB',
      'GPU 0 (Simulated H200): 2.0 GiB',
      'GPU 0 total: 10.0 GiB / 80.0 GiB (simulated)'
    ]);
    expect(tooltipLines(s, undefined)[0]).toMatch(/no kernel/);
  });

  it('reads framework figures from %gpumem data', () => {
    const summary = {
      frameworks: [
        { name: 'torch', label: 'PyTorch', state: 'active', devices: [{ device: 'cuda:0', used: GiB, held: 2 * GiB }] },
        { name: 'jax', label: 'JAX', state: 'absent', devices: [] },
        { name: 'tensorflow', label: 'TensorFlow', state: 'imported', devices: [] }
      ]
    };
    expect(frameworkLines(summary)).toEqual(['PyTorch cuda:0: uses 1.0 GiB, holds 2.0 GiB', 'TensorFlow: imported']);
    expect(frameworkLines(null)).toEqual([]);
  });

  it('sorts variable rows largest first', () => {
    const rows = varRows({
      rows: [
        { name: 'a', type: 'Tensor', device: 'cuda:0', bytes: 10 },
        { name: 'Out[3]', type: 'Tensor', device: 'cuda:0', bytes: 30, hidden: true }
      ]
    });
    expect(rows.map(r => r.name)).toEqual(['Out[3]', 'a']);
    expect(rows[0].hidden).toBe(true);
    expect(varRows({})).toEqual([]);
  });
});

describe('cullWarnings', () => {
  it('names the notebook, its memory, its idle time and the plan; keyed per warning', () => {
    const a = nb('train', 12 * GiB);
    a.activity = {
      execution_state: 'idle',
      last_activity: '2026-11-30T11:00:00Z',
      idle_seconds: 3 * 3600 + 300,
      cull_at: '2026-11-30T14:05:00Z',
      cull_action: 'shutdown'
    };
    const b = nb('busy', 4 * GiB);
    b.activity = { execution_state: 'busy', last_activity: '2026-11-30T14:00:00Z', idle_seconds: 0 };
    const w = cullWarnings(state({ notebooks: [a, b] }));
    expect(w).toHaveLength(1);
    expect(w[0].kernelId).toBe('train');
    expect(w[0].key).toBe('train@2026-11-30T14:05:00Z');
    expect(w[0].message).toContain('holds 12');
    expect(w[0].message).toContain('idle 3 h 5 min');
    expect(w[0].message).toContain('will be shut down at');
  });
  it('formats durations', () => {
    expect(formatDuration(40)).toBe('40 s');
    expect(formatDuration(720)).toBe('12 min');
    expect(formatDuration(7200)).toBe('2 h');
  });
});

describe('smSeries', () => {
  it('is the SM % a step, with gaps where unknown', () => {
    const h = new History();
    h.merge(state({ now: 1000, series: { gpus: [], notebooks: [{ id: 'a', peak_bytes: 0, peak_at: 0, points: [[1000, GiB]] }],
      notebook_sm: [{ id: 'a', peak_bytes: 0, peak_at: 0, points: [[997, 90], [998, 95], [1000, 0]] }] } }));
    expect(smSeries(h, 'a', 1, 5)).toEqual([null, 90, 95, null, 0]);
    expect(smSeries(h, 'b', 1, 2)).toEqual([null, null]);
  });
});
