import { describe, expect, it } from 'vitest';

import { baseName, formatBytes, formatPercent, formatUtil, levelFor, reclaimMessage, sparklinePath } from './format';

describe('formatBytes', () => {
  it.each([
    [0, '0 B'],
    [1023, '1023 B'],
    [1024, '1.0 KiB'],
    [1536, '1.5 KiB'],
    [2 * 1024 ** 3, '2.0 GiB'],
    [3.2 * 1024 ** 3, '3.2 GiB'],
    [80 * 1024 ** 3, '80.0 GiB'],
    [5 * 1024 ** 4, '5.0 TiB'],
    [2048 * 1024 ** 4, '2048.0 TiB'],
    [-1, '?'],
    [Number.NaN, '?']
  ])('%s bytes is %s', (n, want) => {
    expect(formatBytes(n)).toBe(want);
  });
});

describe('formatPercent', () => {
  it.each([
    [0, 100, '0%'],
    [1, 3, '33%'],
    [2, 3, '67%'],
    [5, 0, '?']
  ])('%s of %s is %s', (a, b, want) => {
    expect(formatPercent(a, b)).toBe(want);
  });
});

describe('levelFor', () => {
  it.each([
    ['under the threshold', 70, 100, 0.8, 'ok'],
    ['at the threshold', 80, 100, 0.8, 'warn'],
    ['past it', 90, 100, 0.8, 'warn'],
    ['at 95% exactly', 95, 100, 0.8, 'warn'],
    ['above 95%', 96, 100, 0.8, 'danger'],
    ['alerts off, high', 90, 100, 0, 'ok'],
    ['alerts off, above 95%', 99, 100, 0, 'danger'],
    ['no total', 5, 0, 0.8, 'ok']
  ] as const)('%s', (_name, used, total, threshold, want) => {
    expect(levelFor(used, total, threshold)).toBe(want);
  });
});

describe('baseName and reclaimMessage', () => {
  it('names a notebook by its file', () => {
    expect(baseName('/home/a/work/train.ipynb')).toBe('train.ipynb');
    expect(baseName('train.ipynb')).toBe('train.ipynb');
  });
  it.each([
    [{ processes: 2, bytes: 3.2 * 1024 ** 3, notebook: '/w/train.ipynb', kernel_id: 'abcdef0123', reason: 'restart' },
      'Ended 2 orphans of train.ipynb holding 3.2 GiB after the restart'],
    [{ processes: 1, bytes: 1024 ** 3, notebook: '', kernel_id: 'abcdef0123', reason: 'shutdown' },
      'Ended 1 orphan of kernel abcdef01 holding 1.0 GiB after the shutdown']
  ])('%o', (ev, want) => {
    expect(reclaimMessage(ev)).toBe(want);
  });
});

describe('formatUtil and sparklinePath', () => {
  it('never shows unknown as 0', () => {
    expect(formatUtil({ sm_percent: 97.4 })).toBe('97% SM');
    expect(formatUtil({ sm_percent: 0 })).toBe('0% SM');
    expect(formatUtil(undefined)).toBe('unknown');
  });
  it('draws runs of known values, leaving gaps open', () => {
    expect(sparklinePath([0, 100, null, 50], 30, 10)).toBe('M0.0,10.0L10.0,0.0M30.0,5.0');
    expect(sparklinePath([], 30, 10)).toBe('');
    expect(sparklinePath([null], 30, 10)).toBe('');
  });
});
