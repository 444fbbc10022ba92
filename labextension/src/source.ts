// The one poll of a browser tab, while the page is visible: each GET state
// asks for what came since the newest point it has, and the daemon answers
// right after its next sample (a long poll), so a tab makes one request a
// sample (1/s) and sees each figure as soon as it is taken. When the daemon
// is not running (or the server errs) it slows to one call every few
// seconds, growing to 30 s; nothing throws, so nothing reaches the console.

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { fetchState } from './api';
import { DaemonStatus, History, ReclaimEvent, Reply, State } from './model';

export const POLL_MS = 1000;
// After a reply, the next request goes out at once: the daemon holds it
// until its next sample.
const LONG_POLL_GAP_MS = 50;
const SLOW_MS = 5000;
const MAX_MS = 30000;

export class StateSource {
  readonly history = new History();
  private _state: State | null = null;
  private _unavailable: string | null = null;
  private _daemon: DaemonStatus | null = null;
  private _lastEvent = -1;
  private _changed = new Signal<this, void>(this);
  private _events = new Signal<this, ReclaimEvent[]>(this);
  private _poll: Poll;
  private _failures = 0;
  /** Orphans the daemon ended, per kernel, since it started (its event log). */
  readonly reclaimed = new Map<string, number>();

  constructor() {
    this._poll = new Poll({
      factory: () => this._tick(),
      frequency: { interval: POLL_MS, backoff: false, max: MAX_MS },
      standby: 'when-hidden',
      name: 'gpumem:state'
    });
  }

  get state(): State | null {
    return this._state;
  }
  /** Why there is no state: one line for the user, or null. */
  get unavailable(): string | null {
    return this._unavailable;
  }
  /** Which daemon serves this server (the server extension says it). */
  get daemon(): DaemonStatus | null {
    return this._daemon;
  }
  get changed(): ISignal<this, void> {
    return this._changed;
  }
  /** New reclaim events (never the ones before the page loaded). */
  get events(): ISignal<this, ReclaimEvent[]> {
    return this._events;
  }

  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    this._poll.dispose();
  }

  private async _tick(): Promise<void> {
    let reply: Reply;
    try {
      const since = this._state && this.history.last ? this.history.last + 1 : 0;
      reply = await fetchState(since, Math.max(this._lastEvent, 0));
    } catch (e) {
      reply = { status: 'error', message: `JupyterLab's server did not answer for gpumem (${String(e)})` };
    }
    this._daemon = reply.daemon ?? null;
    if (reply.status !== 'ok') {
      this._failures++;
      this._unavailable = reply.message;
      this._state = null;
      this._setInterval(Math.min(SLOW_MS * this._failures, MAX_MS));
      this._changed.emit();
      return;
    }
    this._failures = 0;
    this._unavailable = null;
    this.history.merge(reply);
    // Without any series (no GPU) there is nothing to wait for: plain polls.
    this._setInterval(this.history.last ? LONG_POLL_GAP_MS : POLL_MS);
    this._state = reply;
    for (const ev of reply.events) {
      if (ev.kind === 'reclaim') {
        this.reclaimed.set(ev.kernel_id, (this.reclaimed.get(ev.kernel_id) ?? 0) + ev.processes);
      }
    }
    if (this._lastEvent < 0) {
      // The first reply: events from before this page are old news.
      this._lastEvent = reply.last_event;
    } else {
      this._lastEvent = reply.last_event;
      if (reply.events.length) {
        this._events.emit(reply.events);
      }
    }
    this._changed.emit();
  }

  private _setInterval(ms: number): void {
    if (this._poll.frequency.interval !== ms) {
      this._poll.frequency = { interval: ms, backoff: false, max: MAX_MS };
    }
  }
}
