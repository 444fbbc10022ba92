import { describe, expect, it } from 'vitest';

import type { Notebook } from './model';
import { whyFoot, whyRows } from './why';

const GiB = 1024 ** 3;

const why = {
  rows: [
    { category: 'variables', name: 'weights', device: 'cuda:0', bytes: 2 * GiB, fix: 'del weights' },
    { category: 'child', name: 'pid 42 (python worker.py)', device: 'GPU 0', bytes: GiB, fix: '%gpumem free --children', pid: 42 },
    { category: 'elsewhere', name: 'Out[3]', device: 'cuda:0', bytes: GiB, holder: 'Out', chain: ['Out', '3'], fix: '%reset -f out' }
  ],
  text: "gpumem why: where this kernel's memory is (pid 7, GPUs)\n\nrow what\nvariable weights\n\nrows: 4.0 GiB; the driver's figure: 4.0 GiB\ntook 12 ms"
};

function nb(pids: number[]): Notebook {
  return { pids: [7], processes: pids.map(pid => ({ pid, per_gpu: [] })) } as unknown as Notebook;
}

describe('whyRows', () => {
  it('puts the name first, the bytes, what it is, and the fix on its own line', () => {
    const { rows, ended } = whyRows(why, nb([7, 42]));
    expect(ended).toEqual([]);
    expect(rows[0]).toEqual({
      name: 'weights',
      bytes: '2.0 GiB',
      sub: 'variable · cuda:0',
      detail: '',
      fix: 'fix: del weights',
      nameCls: ''
    });
    expect(rows[2].detail).toBe('held by Out: Out → 3');
  });
  it('drops the row of a worker that has ended since', () => {
    const { rows, ended } = whyRows(why, nb([7]));
    expect(ended).toEqual([42]);
    expect(rows.map(r => r.name)).toEqual(['weights', 'Out[3]']);
  });
  it('keeps every row while the notebook is not in the state', () => {
    expect(whyRows(why, undefined).rows).toHaveLength(3);
  });
});

describe('whyFoot', () => {
  it("is the kernel's lines under its table", () => {
    expect(whyFoot(why.text)).toEqual(["rows: 4.0 GiB; the driver's figure: 4.0 GiB", 'took 12 ms']);
    expect(whyFoot('title only')).toEqual([]);
  });
});
