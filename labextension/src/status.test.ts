import { describe, expect, it } from 'vitest';

import { frameworkLines, statusView } from './status';
import { GiB, nb, state } from './test-fixtures';

describe('statusView', () => {
  const withNb = state({ notebooks: [nb('k', 2 * GiB)] });
  it('shows the notebook and both parts of its GPU plainly', () => {
    const v = statusView(withNb, null, 'k');
    expect(v.text).toBe('GPU 2.0 GiB (simulated)');
    expect(v.name).toBe('k.ipynb');
    expect(v.bar).toEqual({ mine: 2 / 80, rest: 8 / 80, level: 'ok', gpu: 0 });
    expect(v.lines[0]).toBe("k.ipynb: 2.0 GiB on the GPU (the driver's figure, children included)");
    expect(v.lines[1]).toBe('The bar is GPU 0: this notebook 2.0 GiB (dark), everyone 10.0 GiB of 80.0 GiB (13%)');
  });
  it("colours the bar at the daemon's level for the GPU", () => {
    const s = state({ notebooks: [nb('k', 2 * GiB)] });
    s.gpus[0] = { ...s.gpus[0], memory_used_bytes: 79 * GiB, level: 'danger' };
    expect(statusView(s, null, 'k').bar?.level).toBe('danger');
  });
  it('says GPU n/a and why when there is no figure', () => {
    const cases: [ReturnType<typeof statusView>, RegExp][] = [
      [statusView(null, 'gpumem serve is not running: start it', 'k'), /not running/],
      [
        statusView(state({ gpus: [], warnings: ['no NVIDIA driver found (libnvidia-ml.so.1): GPU figures unavailable'] }), null, 'k'),
        /no NVIDIA driver/
      ],
      [statusView(withNb, null, undefined), /no running kernel/],
      [statusView(withNb, null, 'other'), /does not follow this kernel/]
    ];
    for (const [v, why] of cases) {
      expect(v.text).toBe('GPU n/a');
      expect(v.bar).toBeUndefined();
      expect(v.lines.join(' ')).toMatch(why);
    }
  });
  it('names no notebook when the current tab is not one', () => {
    const v = statusView(withNb, null, null);
    expect(v).toEqual({ text: 'GPU', name: '', lines: ['The current tab is not a notebook: open one to see its GPU memory.'] });
  });
  it('never says 0 B without a driver', () => {
    const v = statusView(state({ gpus: [], notebooks: [nb('k', 0)], warnings: ['no NVIDIA driver found'] }), null, 'k');
    expect(v.text).not.toMatch(/0 B/);
  });
});

describe('frameworkLines', () => {
  it('reads framework figures from %gpumem data', () => {
    const summary = {
      frameworks: [
        { name: 'torch', label: 'PyTorch', state: 'active', devices: [{ device: 'cuda:0', used: GiB, held: 2 * GiB }] },
        { name: 'jax', label: 'JAX', state: 'absent', devices: [] },
        { name: 'cupy', label: 'CuPy', state: 'idle', message: 'memory pool empty', devices: [] },
        { name: 'tensorflow', label: 'TensorFlow', state: 'idle', devices: [] }
      ]
    };
    // The kernel's sentence, never a bare state word ("PyTorch: idle").
    expect(frameworkLines(summary)).toEqual(['PyTorch on cuda:0: uses 1.0 GiB, holds 2.0 GiB', 'CuPy: memory pool empty']);
    expect(frameworkLines(null)).toEqual([]);
  });
});
