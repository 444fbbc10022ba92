import { describe, expect, it } from 'vitest';

import {
  alertChanges,
  alertText,
  Alert,
  History,
  mainGPU,
  kernelLabel,
  Notebook,
  plotRange,
  sparkPath,
  stackNotebooks,
  varRows
} from './model';
import { GiB, nb, state } from './test-fixtures';

describe('History', () => {
  it('merges incremental replies and keeps 15 minutes', () => {
    const h = new History();
    h.merge(
      state({
        now: 1000,
        series: {
          gpus: [],
          notebooks: [
            {
              id: 'a',
              peak_bytes: 0,
              peak_at: 0,
              points: [
                [999, 1],
                [1000, 2]
              ]
            }
          ]
        }
      })
    );
    h.merge(
      state({
        now: 1001,
        series: {
          gpus: [],
          notebooks: [
            {
              id: 'a',
              peak_bytes: 0,
              peak_at: 0,
              points: [
                [1000, 2],
                [1001, 3]
              ]
            }
          ]
        }
      })
    );
    expect([...h.notebooks.get('a')!.entries()]).toEqual([
      [999, 1],
      [1000, 2],
      [1001, 3]
    ]);
    h.merge(state({ now: 1001 + 15 * 60, series: { gpus: [], notebooks: [] } }));
    expect(h.notebooks.has('a')).toBe(false);
  });
});

const pts = (id: string, points: [number, number][], gpu?: number) => ({ id, gpu, peak_bytes: 0, peak_at: 0, points });

describe('History per GPU', () => {
  it("keeps a notebook's total apart from its bytes on each GPU", () => {
    const h = new History();
    h.merge(
      state({
        now: 1000,
        series: { gpus: [], notebooks: [pts('two', [[1000, 61]]), pts('two', [[1000, 20]], 0), pts('two', [[1000, 41]], 1)] }
      })
    );
    expect(h.notebooks.get('two')?.get(1000)).toBe(61);
    expect(h.notebookGpus.get('two/0')?.get(1000)).toBe(20);
    expect(h.notebookGpus.get('two/1')?.get(1000)).toBe(41);
    expect(h.first()).toBe(1000);
  });
});

describe('stackNotebooks', () => {
  it("stacks each notebook's bytes on this GPU, the biggest at the bottom, gaps as 0", () => {
    const h = new History();
    h.merge(
      state({
        now: 1003,
        series: {
          gpus: [
            pts('0', [
              [1001, 9],
              [1002, 9],
              [1003, 12]
            ])
          ],
          notebooks: [
            pts(
              'small',
              [
                [1002, 1],
                [1003, 1]
              ],
              0
            ),
            pts(
              'big',
              [
                [1001, 5],
                [1003, 6]
              ],
              0
            ),
            pts('elsewhere', [[1003, 9]], 1)
          ]
        }
      })
    );
    const st = stackNotebooks(h, [nb('small', 1), nb('big', 6), nb('elsewhere', 9, 1)], 0, 3);
    expect(st.times.slice(-3)).toEqual([1001, 1002, 1003]);
    expect(st.stacks.map(s => s.kernelId)).toEqual(['big', 'small']);
    expect(st.stacks[0].values.slice(-3)).toEqual([5, 0, 6]);
    expect(st.stacks[1].values.slice(-3)).toEqual([5, 1, 7]);
    expect(st.stacks[1].label).toBe('small.ipynb');
    expect(st.used.slice(-3)).toEqual([9, 9, 12]);
    expect(st.top).toBe(12);
  });

  it("draws a two-GPU notebook's bytes on each GPU, never its total", () => {
    const h = new History();
    const two: Notebook = {
      ...nb('two', 61 * GiB),
      per_gpu: [
        { index: 0, bytes: 20 * GiB },
        { index: 1, bytes: 41 * GiB }
      ]
    };
    h.merge(
      state({
        now: 1000,
        series: {
          gpus: [pts('0', [[1000, 20 * GiB]]), pts('1', [[1000, 41 * GiB]])],
          notebooks: [pts('two', [[1000, 61 * GiB]]), pts('two', [[1000, 20 * GiB]], 0), pts('two', [[1000, 41 * GiB]], 1)]
        }
      })
    );
    const on0 = stackNotebooks(h, [two], 0);
    const on1 = stackNotebooks(h, [two], 1);
    expect(on0.stacks[0].values.at(-1)).toBe(20 * GiB);
    expect(on1.stacks[0].values.at(-1)).toBe(41 * GiB);
    expect(on0.top).toBe(20 * GiB);
  });

  it('draws nothing, never 0, before the oldest point', () => {
    const h = new History(3600);
    h.merge(state({ now: 1000, step_seconds: 60, series: { gpus: [pts('0', [[960, 9]])], notebooks: [pts('a', [[960, 4]], 0)] } }));
    const st = stackNotebooks(h, [nb('a', 4)], 0, 3600);
    expect(st.times).toEqual([900, 960]);
    expect(st.stacks[0].values).toEqual([null, 4]);
    expect(st.used).toEqual([null, 9]);
  });

  it('fits the window to a short history, never under a minute', () => {
    expect(plotRange(1000, 1030, 900)).toEqual([970, 1030]); // 30 s of data: a minute
    expect(plotRange(1000, 1300, 900)).toEqual([1000, 1300]); // 5 min of data: 5 min
    expect(plotRange(1000, 5000, 900)).toEqual([4100, 5000]); // more than the window: the window
    expect(plotRange(0, 0, 900)).toEqual([0, 0]);
  });

  it('draws a sparkline within its box', () => {
    const m = new Map([
      [100, 0],
      [150, 5],
      [200, 10]
    ]);
    expect(sparkPath(m, 100, 200, 100, 16, 10)).toBe('M0.0,16.0 L50.0,8.0 L100.0,0.0');
    expect(sparkPath(undefined, 100, 200, 100, 16, 10)).toBe('');
  });

  it('leaves a gap where a figure is missing, when told the step', () => {
    // SM % at 100, 101, then unknown until 103: no line across 101..103.
    const m = new Map([
      [100, 0],
      [101, 100],
      [103, 50]
    ]);
    expect(sparkPath(m, 100, 104, 40, 10, 100, 1)).toBe('M0.0,10.0 L10.0,0.0 M30.0,5.0');
    expect(sparkPath(m, 100, 104, 40, 10, 100)).toBe('M0.0,10.0 L10.0,0.0 L30.0,5.0');
  });
});

describe('History of SM utilization', () => {
  it("keeps each notebook's SM % apart from its bytes, for the same window", () => {
    const h = new History();
    const s = (id: string, points: [number, number][]) => ({ id, peak_bytes: 0, peak_at: 0, points });
    h.merge(
      state({
        now: 1000,
        series: {
          gpus: [],
          notebooks: [s('a', [[1000, GiB]])],
          notebook_sm: [
            s('a', [
              [998, 95],
              [1000, 0]
            ])
          ]
        }
      })
    );
    expect([...h.sm.get('a')!.entries()]).toEqual([
      [998, 95],
      [1000, 0]
    ]);
    expect(h.notebooks.get('a')!.get(1000)).toBe(GiB);
    // A reply without SM series (an older daemon) keeps what there is.
    h.merge(state({ now: 1001, series: { gpus: [], notebooks: [] } }));
    expect(h.sm.get('a')!.size).toBe(2);
    h.merge(state({ now: 1000 + 15 * 60, series: { gpus: [], notebooks: [] } }));
    expect(h.sm.has('a')).toBe(false);
  });
});

describe('alertChanges', () => {
  const threshold: Alert = { id: 'gpu0-1', kind: 'threshold', gpu: 0, kernels: ['k1'], bytes: 70 * GiB, message: 'GPU 0 is 88% full' };
  const cull: Alert = { id: 'cull-k1-1', kind: 'cull', gpu: -1, kernels: ['k1'], bytes: GiB, message: 'will be shut down' };
  const left: Alert = { id: 'left-5-9', kind: 'left_running', gpu: 0, kernels: ['k1'], bytes: GiB, message: 'left running' };

  it('shows each alert once by id, and says which went', () => {
    const shown = new Map<string, Alert>();
    expect(alertChanges([threshold, cull, left], shown).fresh).toEqual([threshold, cull]);
    expect(alertChanges([threshold, cull], shown)).toEqual({ fresh: [], changed: [], gone: [] });
    expect(alertChanges([cull], shown)).toEqual({ fresh: [], changed: [], gone: [threshold] }); // back under
    expect(alertChanges(undefined, shown)).toEqual({ fresh: [], changed: [], gone: [cull] });
    const again = { ...threshold, id: 'gpu0-2' }; // a new crossing
    expect(alertChanges([again], shown).fresh).toEqual([again]);
  });

  it("toasts the daemon's headline where it gives one", () => {
    expect(alertText(threshold)).toBe('GPU 0 is 88% full');
    expect(alertText({ ...threshold, headline: 'GPU 0 is 88% full; biggest: train.ipynb 70.0 GiB' })).toBe(
      'GPU 0 is 88% full; biggest: train.ipynb 70.0 GiB'
    );
  });

  it("says which shown alert's sentence moved, once per new sentence", () => {
    const shown = new Map<string, Alert>();
    alertChanges([threshold], shown);
    const fuller = { ...threshold, bytes: 72 * GiB, message: 'GPU 0 is 90% full' };
    expect(alertChanges([fuller], shown)).toEqual({ fresh: [], changed: [fuller], gone: [] });
    expect(alertChanges([fuller], shown)).toEqual({ fresh: [], changed: [], gone: [] });
    expect(alertChanges([], shown).gone).toEqual([fuller]);
  });
});

describe('labels, frameworks, vars', () => {
  it("labels a kernel by the daemon's display name, an event's kernel gone from the report by its notebook", () => {
    const s = state({ notebooks: [{ ...nb('k', GiB), display_name: 'train.ipynb' }] });
    expect(kernelLabel(s, 'k', '/elsewhere/other.ipynb')).toBe('train.ipynb');
    expect(kernelLabel(s, 'gone', '/home/a/eval.ipynb')).toBe('eval.ipynb');
    expect(kernelLabel(s, '0123456789abcdef')).toBe('kernel 01234567');
    expect(kernelLabel(null, '0123456789abcdef', 'x.ipynb')).toBe('x.ipynb');
  });

  it('picks the GPU a notebook uses most', () => {
    const s = state({ gpus: [state().gpus[0], { ...state().gpus[0], index: 1, name: 'B' }] });
    const n = {
      ...nb('k', 3),
      per_gpu: [
        { index: 0, bytes: 1 },
        { index: 1, bytes: 2 }
      ]
    };
    expect(mainGPU(s, n)?.index).toBe(1);
    expect(mainGPU(s, undefined)?.index).toBe(0);
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
