import { readFileSync } from 'fs';
import { resolve } from 'path';

import { describe, expect, it } from 'vitest';

import { binaryTicks, formatBytes, formatDuration, formatPercent, formatTick, formatUtil, plainTrans, timeTick } from './format';

// The table every face of gpumem is tested against (Go, TypeScript, Python).
const formats = JSON.parse(readFileSync(resolve(__dirname, '../../testdata/formats.json'), 'utf8')) as {
  bytes: [number, string][];
  seconds: [number, string][];
};

describe('formatBytes', () => {
  it('lists cases', () => {
    expect(formats.bytes.length).toBeGreaterThan(10);
  });
  it.each(formats.bytes)('%s bytes is %s (testdata/formats.json)', (n, want) => {
    expect(formatBytes(n)).toBe(want);
  });
  it.each([
    [3.2 * 1024 ** 3, '3.2 GiB'],
    [2048 * 1024 ** 4, '2.0 PiB'],
    [-1, '?'],
    [Number.NaN, '?']
  ])('%s bytes is %s', (n, want) => {
    expect(formatBytes(n)).toBe(want);
  });
});

describe('formatDuration', () => {
  it('lists cases', () => {
    expect(formats.seconds.length).toBeGreaterThan(10);
  });
  it.each(formats.seconds)('%s seconds is %s (testdata/formats.json)', (s, want) => {
    expect(formatDuration(s)).toBe(want);
  });
  it.each([
    [Number.POSITIVE_INFINITY, '?'],
    [Number.NaN, '?']
  ])('%s seconds is %s', (s, want) => {
    expect(formatDuration(s)).toBe(want);
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

describe('binaryTicks', () => {
  const GiB = 1024 ** 3;
  const MiB = 1024 ** 2;
  it.each([
    [80 * GiB, [0, 32, 64, 96].map(x => x * GiB)],
    [20 * GiB, [0, 8, 16, 24].map(x => x * GiB)],
    [3 * GiB, [0, 1, 2, 3].map(x => x * GiB)],
    [4.5 * GiB, [0, 2, 4, 6].map(x => x * GiB)],
    [300 * MiB, [0, 128, 256, 384].map(x => x * MiB)],
    [0, [0, GiB]]
  ])('%s reaches %s', (max, want) => {
    expect(binaryTicks(max, 4)).toEqual(want);
  });
  it('labels ticks in whole binary units', () => {
    expect([0, 16 * GiB, 1.5 * GiB, 512 * MiB].map(formatTick)).toEqual(['0', '16 GiB', '1.5 GiB', '512 MiB']);
  });
});

describe('timeTick', () => {
  it('gives a time of day, never a date, on a short axis', () => {
    const t = new Date(2026, 11, 1, 14, 5, 30).getTime() / 1000;
    expect(timeTick(t, 15 * 60, 'en-GB')).toBe('14:05');
    expect(timeTick(t, 120, 'en-GB')).toBe('14:05:30');
    const midnight = new Date(2026, 11, 2, 0, 0, 0).getTime() / 1000;
    expect(timeTick(midnight, 3600, 'en-GB')).toBe('00:00');
    expect(timeTick(midnight, 24 * 3600, 'en-GB')).toMatch(/2/);
  });
});

describe('plainTrans', () => {
  it('fills placeholders and plurals', () => {
    expect(plainTrans.__('%1 of %2', 'a', 3)).toBe('a of 3');
    expect(plainTrans._n('%1 process', '%1 processes', 1)).toBe('1 process');
    expect(plainTrans._n('%1 process', '%1 processes', 2)).toBe('2 processes');
  });
});

describe('formatUtil', () => {
  it('never shows unknown as 0', () => {
    expect(formatUtil({ sm_percent: 97.4 })).toBe('97% SM');
    expect(formatUtil({ sm_percent: 0 })).toBe('0% SM');
    expect(formatUtil({ sm_percent: 180 })).toBe('180% SM');
    expect(formatUtil(undefined)).toBe('SM unknown');
  });
});
