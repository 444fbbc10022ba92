// The golden report Go writes (testdata/report, TestGoldenReport) read
// as the extension reads the daemon's: every key of it known to the
// model (report.ts) and every key of the model in it, its enumerations'
// values the model's, and rendered through the pure functions. A field
// renamed in Go fails here (and in golden.test-d.ts, by tsc).

import { describe, expect, it } from 'vitest';

import goldenOOM from '../../testdata/report/golden-oom.json';
import goldenOOMOwn from '../../testdata/report/golden-oom-own.json';
import goldenJSON from '../../testdata/report/golden-report.json';
import goldenOwnJSON from '../../testdata/report/golden-report-own.json';
import { formatBytes, formatDuration, formatUtil } from './format';
import { alertChanges, alertText, mainGPU, Notebook } from './model';
import { OOMEvent, reportLines } from './oom';
import {
  ALERT_KINDS,
  COMPUTE_STATES,
  GPU_LEVELS,
  HOLDER_KINDS,
  Report,
  REPORT_SCHEMA,
  REPORT_SHAPE,
  Shape,
  STRAY_CAUSES,
  STRAY_EVIDENCE
} from './report';
import { state } from './test-fixtures';

const golden = goldenJSON as unknown as Report;
/** Alice's own view of it, as a shared daemon serves her (sidecar/api's TestGoldenOwnView). */
const goldenOwn = goldenOwnJSON as unknown as Report;

/** Walks value by shape: the keys the model does not know, and the keys seen per shape. */
function walk(value: unknown, shape: Shape, path: string, seen: Map<Shape, Set<string>>, unknown: string[]): void {
  if (Array.isArray(value)) {
    value.forEach((v, i) => walk(v, shape, `${path}[${i}]`, seen, unknown));
    return;
  }
  if (value === null || typeof value !== 'object') {
    unknown.push(`${path}: ${JSON.stringify(value)} where the model has an object`);
    return;
  }
  const keys = seen.get(shape) ?? new Set<string>();
  seen.set(shape, keys);
  for (const [k, v] of Object.entries(value)) {
    keys.add(k);
    if (!shape.keys.includes(k)) {
      unknown.push(`${path}.${k}`);
    } else if (shape.nested[k]) {
      walk(v, shape.nested[k], `${path}.${k}`, seen, unknown);
    }
  }
}

/** Every shape in shape, itself included, with where it first is. */
function shapes(shape: Shape, path: string, into = new Map<Shape, string>()): Map<Shape, string> {
  if (!into.has(shape)) {
    into.set(shape, path);
    for (const [k, s] of Object.entries(shape.nested)) {
      shapes(s, `${path}.${k}`, into);
    }
  }
  return into;
}

describe('the golden report', () => {
  it('carries the schema this extension reads', () => {
    expect(golden.schema).toBe(REPORT_SCHEMA);
  });

  it('has no key the model does not know', () => {
    const unknown: string[] = [];
    walk(golden, REPORT_SHAPE, 'report', new Map(), unknown);
    walk(goldenOwn, REPORT_SHAPE, 'own', new Map(), unknown);
    expect(unknown, "keys of Go's report missing from report.ts (renamed or new in Go?)").toEqual([]);
  });

  it('has every key the model knows', () => {
    const seen = new Map<Shape, Set<string>>();
    walk(golden, REPORT_SHAPE, 'report', seen, []);
    walk(goldenOwn, REPORT_SHAPE, 'own', seen, []); // view is the own view's ("own")
    const missing: string[] = [];
    for (const [s, path] of shapes(REPORT_SHAPE, 'report')) {
      for (const k of s.keys) {
        if (!seen.get(s)?.has(k)) {
          missing.push(`${path}.${k}`);
        }
      }
    }
    expect(missing, "keys of report.ts that Go's report no longer writes (renamed or removed in Go?)").toEqual([]);
  });

  it("has the model's enumerations, each value of them", () => {
    const holders = golden.gpus.flatMap(g => [...(g.holders ?? []), ...(g.holders_by_user ?? [])]);
    const strays = golden.notebooks.flatMap(nb => nb.stray_contexts ?? []);
    const values: [string, readonly string[], string[]][] = [
      ['holder kinds', HOLDER_KINDS, holders.map(h => h.kind)],
      ['compute states', COMPUTE_STATES, golden.notebooks.flatMap(nb => (nb.compute ? [nb.compute.state] : []))],
      ['alert kinds', ALERT_KINDS, (golden.alerts ?? []).map(a => a.kind)],
      ['stray evidence', STRAY_EVIDENCE, strays.map(s => s.evidence)]
    ];
    for (const [what, model, got] of values) {
      expect(new Set(got), what).toEqual(new Set(model));
    }
    // A cause the golden report does not show (visible_devices) is still the model's; a level too (danger).
    for (const s of strays) {
      expect(STRAY_CAUSES).toContain(s.cause);
    }
    for (const g of golden.gpus) {
      expect(GPU_LEVELS).toContain(g.level);
    }
  });
});

describe('the golden report, rendered', () => {
  // What the server extension passes on (view.py): the GPUs without their holders, the notebooks with paths.
  const notebooks: Notebook[] = golden.notebooks.map(nb => ({ ...nb, path: '' }));
  const st = state({
    gpus: golden.gpus.map(({ holders, holders_by_user, ...g }) => g),
    notebooks,
    alerts: golden.alerts,
    left_running: golden.left_running
  });
  const byUser = (user: string) => notebooks.filter(nb => nb.user === user);

  it('names its notebooks as the daemon names them', () => {
    expect(notebooks.map(nb => nb.display_name)).toEqual(['train.ipynb', 'finetune.ipynb', 'eval.ipynb', 'kernel da7eda7e']);
  });

  it("colours each GPU at the daemon's level, and says when one is back under the threshold", () => {
    expect(golden.gpus.map(g => g.level)).toEqual(['warn', 'ok']);
    expect(golden.gpus[0].under_threshold).toBeUndefined();
    expect(golden.gpus[1].under_threshold).toBe('GPU 1 is back under the alert threshold: 12.5 GiB of 80.0 GiB used (16%).');
  });

  it('finds the GPU each notebook uses most', () => {
    expect(mainGPU(st, byUser('bob')[0])?.index).toBe(0);
    expect(mainGPU(st, notebooks[2])?.index).toBe(1);
  });

  it('writes figures as every face writes them', () => {
    expect(formatBytes(golden.gpus[0].memory_used_bytes)).toBe('70.0 GiB');
    expect(formatBytes(notebooks[0].gpu_memory_bytes)).toBe('40.5 GiB');
    expect(formatUtil(notebooks[0].utilization)).toBe('0% SM');
    expect(formatUtil(byUser('bob')[0].utilization)).toBe('SM unknown'); // on GPU 1 too
    expect(formatUtil(notebooks[2].utilization)).toBe('SM unknown'); // GPU 1 cannot say
    expect(formatDuration(notebooks[0].activity?.idle_seconds ?? -1)).toBe('3 h 5 min');
  });

  it('toasts the threshold and the cull warning, with their headlines', () => {
    const { fresh } = alertChanges(st.alerts, new Map());
    expect(fresh.map(a => a.kind).sort()).toEqual(['cull', 'threshold']);
    const threshold = fresh.find(a => a.kind === 'threshold');
    expect(threshold && alertText(threshold)).toBe(threshold?.headline);
    const cull = fresh.find(a => a.kind === 'cull');
    expect(cull?.message).toContain('idle 3 h 5 min');
    // Out of its notebook, the toast names it.
    expect(cull && alertText(cull)).toBe(
      'train.ipynb holds 40.5 GiB, idle 3 h 5 min: it will be shut down at 14:05:00 unless used or kept.'
    );
  });

  it('reports the out-of-memory event', () => {
    const ev = goldenOOM as unknown as OOMEvent;
    expect(reportLines(ev)).toEqual([
      'eval.ipynb, cell [7], line 3: asked for 20.0 GiB (torch.OutOfMemoryError)',
      "logits = model(batch.to('cuda'))",
      'this kernel: 9.0 GiB allocated, 2.0 GiB cached (1.0 GiB releasable, 1.0 GiB fragmented)',
      'held only by IPython: 2.0 GiB (Out[5])',
      'GPU 1 NVIDIA H200: 12.5 GiB of 80.0 GiB used, 67.5 GiB free'
    ]);
    expect(ev.holders.map(h => h.name)).toEqual(['this kernel', 'finetune.ipynb']);
    expect(formatDuration(ev.holders[0].idle_seconds ?? -1)).toBe('1 min 30 s');
  });

  it("reports alice's view of it: bob is one holder, his total", () => {
    const ev = goldenOOMOwn as unknown as OOMEvent;
    expect(ev.view).toBe('own');
    expect(ev.holders.map(h => [h.kind, h.name, formatBytes(h.bytes)])).toEqual([
      ['notebook', 'this kernel', '12.0 GiB'],
      ['user', 'user bob', '518.0 MiB']
    ]);
    expect(JSON.stringify(ev)).not.toMatch(/finetune|b0b0b0b0|kernel-c\.json/);
  });
});
