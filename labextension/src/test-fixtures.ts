// Notebooks and states for the unit tests (not built into the extension).

import { Notebook, State } from './model';

export const GiB = 1024 ** 3;

export function nb(id: string, bytes: number, gpu = 0, path = `${id}.ipynb`): Notebook {
  return {
    kernel_id: id,
    notebook: `/root/${path}`,
    display_name: path,
    path,
    pids: [100],
    user: 'ann',
    gpu_memory_bytes: bytes,
    peak_bytes: bytes,
    per_gpu: [{ index: gpu, bytes }],
    processes: [{ pid: 100, per_gpu: [{ index: gpu, bytes }] }]
  };
}

export function state(over: Partial<State> = {}): State {
  return {
    status: 'ok',
    now: 1000,
    step_seconds: 1,
    alert_threshold: 0.8,
    gpus: [
      {
        index: 0,
        uuid: 'GPU-0',
        name: 'Simulated H200',
        memory_total_bytes: 80 * GiB,
        memory_used_bytes: 10 * GiB,
        simulated: true,
        level: 'ok',
        notebook_bytes: 10 * GiB,
        other_bytes: 0,
        free_bytes: 70 * GiB
      }
    ],
    notebooks: [],
    others: [],
    warnings: [],
    series: { gpus: [], notebooks: [] },
    events: [],
    last_event: 0,
    ...over
  };
}
