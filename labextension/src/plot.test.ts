import { describe, expect, it } from 'vitest';

import { binaryTicks, formatTick, plainTrans } from './format';
import { Stacked } from './model';
import { axisSize, identityAt, Y_GAP, Y_TICK } from './plot';

const GiB = 1024 ** 3;

describe('identityAt', () => {
  // Two bands (2 GiB, then 1 GiB on top) under a GPU line at 5 GiB.
  const st: Stacked = {
    times: [1, 2],
    stacks: [
      { kernelId: 'a', label: 'train.ipynb', values: [2 * GiB, 2 * GiB] },
      { kernelId: 'b', label: 'eval.ipynb', values: [3 * GiB, 3 * GiB] }
    ],
    used: [5 * GiB, null],
    top: 5 * GiB
  };
  it('names the band under the pointer with its own bytes', () => {
    expect(identityAt(st, 0, GiB, plainTrans)).toBe('train.ipynb: 2.0 GiB');
    expect(identityAt(st, 0, 2.5 * GiB, plainTrans)).toBe('eval.ipynb: 1.0 GiB');
  });
  it('names the rest of the GPU above the bands, and nothing above the line', () => {
    expect(identityAt(st, 0, 4 * GiB, plainTrans)).toBe('Other users and processes: 2.0 GiB');
    expect(identityAt(st, 0, 6 * GiB, plainTrans)).toBeNull();
    expect(identityAt(st, 1, 4 * GiB, plainTrans)).toBeNull(); // no GPU figure there
    expect(identityAt(st, 5, GiB, plainTrans)).toBeNull();
  });
});

describe('axisSize', () => {
  // A font of 7 px a character: "128 GiB" is 49 px.
  const measure = (s: string) => 7 * s.length;
  it('is as wide as the widest label, its tick and the gap', () => {
    const labels = ['0', '64 GiB', '128 GiB'];
    expect(axisSize(labels, measure)).toBe(49 + Y_TICK + Y_GAP + 2);
    expect(axisSize(labels, measure)).toBeGreaterThan(56); // the fixed width that cut "128 GiB" to "28 GiB"
  });
  it('fits 512 MiB and an empty axis', () => {
    expect(axisSize(['0', '256 MiB', '512 MiB'], measure)).toBeGreaterThanOrEqual(49 + Y_TICK + Y_GAP);
    expect(axisSize([], measure)).toBe(Y_TICK + Y_GAP + 2);
  });
  it('labels the ticks of a 3-digit plot in full', () => {
    const ticks = binaryTicks(100 * GiB, 3).map(formatTick);
    expect(ticks[ticks.length - 1]).toBe('128 GiB');
    expect(binaryTicks(400 * 1024 ** 2, 3).map(formatTick)).toContain('512 MiB');
  });
});
