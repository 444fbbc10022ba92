// Type-checked, never run (vitest's typecheck, tsconfig.test.json): the
// golden report Go writes (testdata/report) must be assignable to the
// extension's types. A field Go renames or drops that the types require
// fails here; golden.test.ts checks every key, both ways, at run time.

import { expectTypeOf, test } from 'vitest';

import goldenOOM from '../../testdata/report/golden-oom.json';
import golden from '../../testdata/report/golden-report.json';
import goldenOwn from '../../testdata/report/golden-report-own.json';
import { Notebook, State } from './model';
import { OOMEvent } from './oom';
import { Report } from './report';

/** T as JSON can carry it: a string enumeration is any string there. */
type Wide<T> = T extends string
  ? string
  : T extends number
    ? number
    : T extends boolean
      ? boolean
      : T extends readonly (infer U)[]
        ? Wide<U>[]
        : T extends object
          ? { [K in keyof T]: Wide<T[K]> }
          : T;

test('the golden report is a Report', () => {
  const report: Wide<Report> = golden;
  const own: Wide<Report> = goldenOwn;
  expectTypeOf(report).toEqualTypeOf<Wide<Report>>();
  expectTypeOf(own).toEqualTypeOf<Wide<Report>>();
});

test("the golden report's parts are the State's", () => {
  // What the server extension passes on (view.py): the GPUs, and the notebooks with their paths.
  const gpus: Wide<State['gpus']> = golden.gpus;
  const notebooks: Wide<Notebook>[] = golden.notebooks.map(nb => ({ ...nb, path: '' }));
  const alerts: Wide<State['alerts']> = golden.alerts;
  const leftRunning: Wide<State['left_running']> = golden.left_running;
  expectTypeOf(gpus).not.toBeAny();
  expectTypeOf(notebooks).not.toBeAny();
  expectTypeOf(alerts).not.toBeAny();
  expectTypeOf(leftRunning).not.toBeAny();
});

test('the golden out-of-memory event is an OOMEvent', () => {
  const ev: Wide<OOMEvent> = goldenOOM;
  expectTypeOf(ev).not.toBeAny();
});
