/** A tiny browser for page tests: keeps cookies, posts forms, reads CSRF tokens out of pages. */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { expect } from 'vitest';
import { form } from '../helpers/oauth.js';

export class Browser {
  readonly cookies = new Map<string, string>();

  constructor(
    private readonly app: FastifyInstance,
    private readonly remoteAddress = '127.0.0.1',
    private readonly userAgent?: string,
  ) {}

  private cookieHeader(): Record<string, string> {
    const agent: Record<string, string> = this.userAgent === undefined ? {} : { 'user-agent': this.userAgent };
    if (this.cookies.size === 0) return agent;
    return { ...agent, cookie: [...this.cookies].map(([k, v]) => `${k}=${v}`).join('; ') };
  }

  private remember(res: LightMyRequestResponse): LightMyRequestResponse {
    for (const c of res.cookies as { name: string; value: string; maxAge?: number; expires?: Date }[]) {
      const gone = c.value === '' || c.maxAge === 0 || (c.expires !== undefined && c.expires.getTime() <= Date.now());
      if (gone) this.cookies.delete(c.name);
      else this.cookies.set(c.name, c.value);
    }
    return res;
  }

  async get(url: string): Promise<LightMyRequestResponse> {
    return this.remember(await this.app.inject({ method: 'GET', url, headers: this.cookieHeader(), remoteAddress: this.remoteAddress }));
  }

  async post(url: string, fields: Record<string, string | string[]>): Promise<LightMyRequestResponse> {
    return this.remember(
      await this.app.inject({
        method: 'POST',
        url,
        headers: { ...this.cookieHeader(), 'content-type': 'application/x-www-form-urlencoded' },
        payload: form(fields),
        remoteAddress: this.remoteAddress,
      }),
    );
  }

  /** POSTs a JSON body (`raw`: sent as it is), as a page script's fetch does. */
  async postJson(url: string, body: unknown, headers: Record<string, string> = {}, raw = false): Promise<LightMyRequestResponse> {
    return this.remember(
      await this.app.inject({
        method: 'POST',
        url,
        headers: { ...this.cookieHeader(), 'content-type': 'application/json', ...headers },
        payload: raw ? String(body) : JSON.stringify(body),
        remoteAddress: this.remoteAddress,
      }),
    );
  }

  /** GETs `url` and returns the CSRF token of its form. */
  async csrf(url: string): Promise<string> {
    const res = await this.get(url);
    expect(res.statusCode).toBe(200);
    return csrfTokenIn(res.body);
  }

  async login(email: string, password: string, returnTo?: string): Promise<LightMyRequestResponse> {
    const csrf_token = await this.csrf('/login');
    return this.post('/login', { email, password, csrf_token, ...(returnTo === undefined ? {} : { return_to: returnTo }) });
  }
}

export function csrfTokenIn(html: string): string {
  const match = /name="csrf_token" value="([^"]+)"/.exec(html);
  if (!match?.[1]) throw new Error(`no csrf_token in page:\n${html.slice(0, 500)}`);
  return match[1];
}

/** AZ-7: what every page (and every redirect from a page route) carries. */
export function expectPageSecurityHeaders(res: LightMyRequestResponse): void {
  const csp = String(res.headers['content-security-policy']);
  expect(csp).toContain("frame-ancestors 'none'");
  expect(csp).toContain("default-src 'self'");
  expect(csp).not.toMatch(/https?:|unsafe-inline/);
  expect(res.headers['x-frame-options']).toBe('DENY');
  expect(res.headers['referrer-policy']).toBe('no-referrer');
  expect(res.headers['cache-control']).toBe('no-store');
}
