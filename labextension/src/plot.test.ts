import { describe, expect, it } from 'vitest';

import { plainTrans } from './format';
import { Stacked } from './model';
import { identityAt } from './plot';

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
