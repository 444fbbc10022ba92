// Calls to the server extension (gpumem/api/v1/...), with Jupyter's auth
// and XSRF handled by ServerConnection.

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { Reply } from './model';

const settings = ServerConnection.makeSettings();

async function call<T>(path: string, init: RequestInit = {}): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'gpumem', 'api', 'v1', path);
  const resp = await ServerConnection.makeRequest(url, init, settings);
  let body: unknown = null;
  try {
    body = await resp.json();
  } catch {
    body = null;
  }
  if (!resp.ok) {
    const msg = (body as { message?: string } | null)?.message ?? resp.statusText;
    throw new Error(`gpumem: ${path}: ${resp.status} ${msg}`);
  }
  return body as T;
}

/**
 * The state since a time (unix seconds; 0 = the last 15 minutes). With
 * wait, a since newer than the daemon's last sample is answered after its
 * next one (the long poll); older than 15 minutes, the points are a minute
 * apart.
 */
export function fetchState(since: number, eventsAfter: number, wait = true): Promise<Reply> {
  const q = new URLSearchParams();
  if (since > 0) {
    q.set('since', String(since));
    if (wait) {
      q.set('wait', '1');
    }
  }
  q.set('events_after', String(eventsAfter));
  return call<Reply>(`state?${q.toString()}`);
}

export interface KernelReply<K extends string> {
  status: 'ok' | 'no_daemon' | 'error';
  message?: string;
  [key: string]: unknown;
  kind?: K;
}

/** Frees cache (only) in one of this server's kernels, through the daemon. */
export function freeCache(kernelId: string): Promise<KernelReply<'free'>> {
  return call(`kernels/${encodeURIComponent(kernelId)}/free`, { method: 'POST' });
}

/** Keeps one of this server's kernels from the cull ("Keep it"): the daemon counts it as use. */
export function keepKernel(kernelId: string): Promise<KernelReply<'keep'>> {
  return call(`kernels/${encodeURIComponent(kernelId)}/keep`, { method: 'POST' });
}

/** Ends processes gpumem serve left running for one of this server's kernels. */
export function endOrphans(kernelId: string, pids: number[]): Promise<KernelReply<'end'>> {
  return call(`kernels/${encodeURIComponent(kernelId)}/orphans/end`, { method: 'POST', body: JSON.stringify({ pids }) });
}

/** %gpumem vars's data for a kernel, read silently through the daemon. */
export function fetchVars(kernelId: string, allDevices = false): Promise<KernelReply<'vars'>> {
  return call(`kernels/${encodeURIComponent(kernelId)}/vars${allDevices ? '?all_devices=1' : ''}`);
}

/** %gpumem's data (per-framework figures), read silently through the daemon. */
export function fetchSummary(kernelId: string): Promise<KernelReply<'summary'>> {
  return call(`kernels/${encodeURIComponent(kernelId)}/summary`);
}

/** %gpumem why's rows for a kernel (rendered text included), read through the daemon. */
export function fetchWhy(kernelId: string): Promise<KernelReply<'why'>> {
  return call(`kernels/${encodeURIComponent(kernelId)}/why`);
}

/**
 * Ends the kernel's GPU-holding worker processes (never the kernel): the
 * idle ones, or, with pids, those (confirmed by the user) and only them.
 */
export function freeChildren(kernelId: string, pids: number[] = []): Promise<KernelReply<'children'>> {
  const init: RequestInit = { method: 'POST' };
  if (pids.length > 0) {
    init.body = JSON.stringify({ pids });
  }
  return call(`kernels/${encodeURIComponent(kernelId)}/children/free`, init);
}

/** A kernel's memory snapshots (newest last), kept by the daemon. */
export function fetchSnapshots(kernelId: string): Promise<KernelReply<'snapshots'>> {
  return call(`kernels/${encodeURIComponent(kernelId)}/snapshots`);
}

/** One snapshot and, once reduced, its reduction. */
export function fetchSnapshot(kernelId: string, id: string): Promise<KernelReply<'snapshot'>> {
  return call(`kernels/${encodeURIComponent(kernelId)}/snapshots/${encodeURIComponent(id)}`);
}

/** Where the browser downloads the snapshot's raw pickle. */
export function snapshotRawUrl(kernelId: string, id: string): string {
  return URLExt.join(
    settings.baseUrl,
    'gpumem',
    'api',
    'v1',
    'kernels',
    encodeURIComponent(kernelId),
    'snapshots',
    encodeURIComponent(id),
    'raw'
  );
}
