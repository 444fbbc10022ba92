// What "Free workers" asks before it ends a kernel's worker processes.
// gpumem serve ends, unasked, only the workers idle by its readings; one
// that computes, or whose work is unknown, it leaves running unless its
// pid is confirmed. The panel asks first, naming each such worker and its
// SM %, from the last sample's figures. Pure: unit-tested in
// workers.test.ts.

import { plainTrans, Trans } from './format';
import type { Notebook } from './model';

/**
 * A reading at or above this share of SM or memory time computes: gpumem
 * serve's default --compute-threshold.
 */
export const COMPUTE_THRESHOLD = 1;

/** A worker process that computes on a GPU, or whose work is unknown. */
export interface BusyWorker {
  pid: number;
  gpus: number[];
  /** Its highest SM % and memory % over its GPUs; absent when a GPU cannot say. */
  sm?: number;
  mem?: number;
}

/** What "Free workers" does: ask about busy, or free the idle workers at once. */
export interface FreeWorkersPlan {
  /** The workers to ask about; none: free the idle ones unasked. */
  busy: BusyWorker[];
  /** Every worker holding GPU memory (the kernel aside). */
  workers: number[];
}

/** The plan for a notebook: its processes holding GPU memory, the kernel (its first pid) aside. */
export function planFreeWorkers(nb: Notebook | undefined): FreeWorkersPlan {
  const plan: FreeWorkersPlan = { busy: [], workers: [] };
  if (!nb) {
    return plan;
  }
  const kernel = nb.pids[0];
  for (const p of nb.processes) {
    if (p.pid === kernel || plan.workers.includes(p.pid)) {
      continue;
    }
    plan.workers.push(p.pid);
    const gpus = p.per_gpu.map(g => g.index);
    const known = p.per_gpu.every(g => g.utilization !== undefined);
    const sm = Math.max(0, ...p.per_gpu.map(g => g.utilization?.sm_percent ?? 0));
    const mem = Math.max(0, ...p.per_gpu.map(g => g.utilization?.memory_percent ?? 0));
    if (!known) {
      plan.busy.push({ pid: p.pid, gpus });
    } else if (sm >= COMPUTE_THRESHOLD || mem >= COMPUTE_THRESHOLD) {
      plan.busy.push({ pid: p.pid, gpus, sm, mem });
    }
  }
  return plan;
}

/** The user's answer to the question: end the busy workers too, the idle ones only, or nothing. */
export type FreeWorkersChoice = 'all' | 'idle' | 'cancel';

/** The choice a button of the question's dialog stands for: its warn button ends the busy workers too. */
export function choiceOf(button: { accept: boolean; displayType?: string }): FreeWorkersChoice {
  if (!button.accept) {
    return 'cancel';
  }
  return button.displayType === 'warn' ? 'all' : 'idle';
}

/**
 * The pids to confirm to gpumem serve for the choice: every worker for
 * "all" (a confirmed request ends those pids, and only them), none for
 * "idle" (the daemon ends the idle ones); null: send nothing.
 */
export function pidsToConfirm(plan: FreeWorkersPlan, choice: FreeWorkersChoice): number[] | null {
  switch (choice) {
    case 'all':
      return [...plan.workers];
    case 'idle':
      return [];
    default:
      return null;
  }
}

function onGPUs(gpus: number[], trans: Trans): string {
  if (gpus.length === 0) {
    return trans.__('a GPU');
  }
  return gpus.length === 1 ? trans.__('GPU %1', gpus[0]) : trans.__('GPUs %1', gpus.join(', '));
}

/** One line per busy worker: "pid 1234 computes at 90% SM on GPU 0". */
export function busyLines(busy: BusyWorker[], trans: Trans = plainTrans): string[] {
  return busy.map(w => {
    const on = onGPUs(w.gpus, trans);
    if (w.sm === undefined) {
      return trans.__('pid %1: whether it computes on %2 is unknown', w.pid, on);
    }
    if (w.sm >= COMPUTE_THRESHOLD) {
      return trans.__('pid %1 computes at %2% SM on %3', w.pid, w.sm, on);
    }
    return trans.__('pid %1 computes on %2 (%3% SM, %4% memory just now)', w.pid, on, w.sm, w.mem ?? 0);
  });
}
