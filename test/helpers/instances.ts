/**
 * What the tests of several instances share (test/instances.test.ts with server processes,
 * test/pgbouncer.test.ts behind PgBouncer): HTTP answers read once, the "honoured within a
 * deadline" poll, and a browser whose one cookie jar serves every instance.
 */
import { performance } from 'node:perf_hooks';

/** Anything with a base URL: a server process, an app listening in this process. */
export interface Reachable {
  url: string;
}

export interface Observed {
  status: number;
  headers: Headers;
  body: any;
}

export async function observe(res: Response): Promise<Observed> {
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // an HTML page or an empty body
  }
  return { status: res.status, headers: res.headers, body };
}

export const describeObserved = (o: Observed | undefined): string =>
  o === undefined ? 'nothing' : `${o.status} ${(typeof o.body === 'string' ? o.body : JSON.stringify(o.body)).slice(0, 300)}`;

/**
 * `honouredWithin` repeats `probe` until `ok` holds, and fails unless a probe started within
 * `deadlineMs` of `since` saw it; it returns the milliseconds from `since` to the end of the
 * successful probe, also kept in `timings` (per assertion, for the file to print at the end).
 */
export function deadlinePoll(deadlineMs: number) {
  const timings: Record<string, number> = {};
  async function honouredWithin(what: string, since: number, probe: () => Promise<Observed>, ok: (o: Observed) => boolean, intervalMs = 50): Promise<number> {
    let last: Observed | undefined;
    let attempts = 0;
    for (;;) {
      const began = performance.now();
      if (began - since > deadlineMs) break;
      last = await probe();
      attempts++;
      if (ok(last)) {
        const elapsed = Math.round(performance.now() - since);
        timings[what] = elapsed;
        return elapsed;
      }
      await new Promise((r) => setTimeout(r, intervalMs));
    }
    throw new Error(`${what}: not honoured within ${deadlineMs} ms (${attempts} probes); last answer: ${describeObserved(last)}`);
  }
  return { timings, honouredWithin };
}

export function formPost(url: string, fields: Record<string, string>, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body: new URLSearchParams(fields),
    redirect: 'manual',
  });
}

/** A browser: one cookie jar for every instance (cookies are per host, not per port), redirects not followed. */
export class UserAgent {
  private readonly jar = new Map<string, string>();

  async fetch(instance: Reachable, pathOrUrl: string, init: RequestInit = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    if (this.jar.size > 0) headers.set('cookie', [...this.jar].map(([k, v]) => `${k}=${v}`).join('; '));
    const res = await fetch(new URL(pathOrUrl, instance.url), { ...init, headers, redirect: 'manual' });
    for (const cookie of res.headers.getSetCookie()) {
      const [pair = ''] = cookie.split(';');
      const eq = pair.indexOf('=');
      const name = pair.slice(0, eq);
      const value = pair.slice(eq + 1);
      if (value === '' || /max-age=0/i.test(cookie)) this.jar.delete(name);
      else this.jar.set(name, value);
    }
    return res;
  }

  postForm(instance: Reachable, pathOrUrl: string, fields: Record<string, string>): Promise<Response> {
    return this.fetch(instance, pathOrUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams(fields),
    });
  }
}

export const csrfIn = (html: string): string => {
  const token = /name="csrf_token" value="([^"]+)"/.exec(html)?.[1];
  if (!token) throw new Error(`no csrf_token in page: ${html.slice(0, 300)}`);
  return token;
};
const decodeHtml = (s: string) => s.replace(/&#39;/g, "'").replace(/&quot;/g, '"').replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
/** The hidden fields of a form (the consent page carries the authorization request in them). */
export const hiddenIn = (html: string): Record<string, string> =>
  Object.fromEntries([...html.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)"/g)].map((m) => [m[1]!, decodeHtml(m[2]!)]));
