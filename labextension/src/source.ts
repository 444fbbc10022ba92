// The one poll of a browser tab, while the page is visible: each GET state
// asks for what came since the newest point it has, and the daemon answers
// right after its next sample (a long poll), so a tab makes one request a
// sample (1/s) and sees each figure as soon as it is taken. When the daemon
// is not running (or the server errs) it slows to one call every few
// seconds, growing to 30 s; nothing throws, so nothing reaches the console.
// A plot window longer than the daemon's 15 minutes at the sampling
// interval is read apart, at a point a minute, once a minute.

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { fetchState } from './api';
import { DaemonStatus, FINE_WINDOW, History, ReclaimEvent, Reply, State } from './model';

export const POLL_MS = 1000;
// After a reply, the next request goes out at once: the daemon holds it
// until its next sample.
const LONG_POLL_GAP_MS = 50;
const SLOW_MS = 5000;
const MAX_MS = 30000;
// How often the minute points of a long window are read again.
const COARSE_EVERY_S = 60;

export class StateSource {
  readonly history = new History();
  private _coarse: History | null = null;
  private _coarseAt = 0;
  private _window = FINE_WINDOW;
  private _refreshMs = POLL_MS;
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

  /**
   * The state of a sample taken after an action done at since (unix
   * seconds): the first reply that says a time at or after it, or the
   * second reply at the latest (one asked for before the action may come
   * back first, and the browser's clock may not be the server's); null if
   * none comes within timeoutMs.
   */
  sampleAfter(since: number, timeoutMs: number): Promise<State | null> {
    return new Promise(resolve => {
      let replies = 0;
      const done = (st: State | null) => {
        clearTimeout(timer);
        this._changed.disconnect(onChange);
        resolve(st);
      };
      const onChange = () => {
        replies++;
        if (this._state && (this._state.now >= since || replies >= 2)) {
          done(this._state);
        }
      };
      const timer = setTimeout(() => done(null), timeoutMs);
      this._changed.connect(onChange);
      void this.refresh();
    });
  }

  /** The plots' window in seconds: past 15 minutes, minute points are read too. */
  get window(): number {
    return this._window;
  }
  set window(seconds: number) {
    if (seconds === this._window) {
      return;
    }
    this._window = seconds;
    this._coarse = null;
    this._coarseAt = 0;
    if (seconds > FINE_WINDOW) {
      void this.refresh();
    }
  }

  /** How often to ask at least, in seconds (a setting): 1 follows every sample. */
  set refreshSeconds(seconds: number) {
    this._refreshMs = Math.max(POLL_MS, Math.round(seconds * 1000));
  }

  /**
   * The history a plot of the given window draws from: the minute points
   * once they reach further back than the 15 minutes of the sampling
   * interval's, else those (all there is, in more detail).
   */
  historyFor(windowSeconds: number): History {
    const c = this._coarse;
    return windowSeconds > FINE_WINDOW && c && c.last - c.first() > FINE_WINDOW ? c : this.history;
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
    // Without any series (no GPU) there is nothing to wait for: plain
    // polls; a refresh setting above a second asks that often.
    const gap = this._refreshMs > POLL_MS ? this._refreshMs : LONG_POLL_GAP_MS;
    this._setInterval(this.history.last ? gap : Math.max(POLL_MS, this._refreshMs));
    await this._readCoarse(reply.now);
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

  /** Reads the minute points of a window past 15 minutes, once a minute. */
  private async _readCoarse(now: number): Promise<void> {
    const w = this._window;
    if (w <= FINE_WINDOW || now - this._coarseAt < COARSE_EVERY_S) {
      return;
    }
    try {
      const reply = await fetchState(now - w, Math.max(this._lastEvent, 0), false);
      if (reply.status === 'ok' && this._window === w) {
        const coarse = this._coarse ?? new History(w);
        coarse.merge(reply);
        this._coarse = coarse;
        this._coarseAt = now;
      }
    } catch {
      // The fine points still draw; the next tick tries again.
    }
  }

  private _setInterval(ms: number): void {
    if (this._poll.frequency.interval !== ms) {
      this._poll.frequency = { interval: ms, backoff: false, max: MAX_MS };
    }
  }
}
