import { z } from 'zod';
import { isWellFormed } from '../../lib/validate.js';

const LOOPBACK_HOSTS = new Set(['localhost', '127.0.0.1', '[::1]']);

/**
 * Why a redirect URI may not be registered, or null when it may (OAuth 2.1 §2.3, RFC 9700 §2.1):
 * absolute, no fragment, no wildcard, no user info, https — or http for loopback hosts only. The string is
 * stored as written and later compared byte for byte, so nothing here normalizes it.
 */
export function redirectUriProblem(value: string): string | null {
  if (value.length > 2000) return 'must be at most 2000 characters';
  if (/[\s\x00-\x1f\x7f]/.test(value)) return 'must not contain spaces or control characters';
  // A lone surrogate would be stored as U+FFFD: not the URI sent, so never matched exactly.
  if (!isWellFormed(value)) return 'must be well-formed Unicode';
  if (!URL.canParse(value)) return 'must be an absolute URL';
  const url = new URL(value);
  if (value.includes('#')) return 'must not contain a fragment';
  // Matching is exact, so a `*` would never match as a wildcard; refused so nobody thinks it does.
  if (value.includes('*')) return 'must not contain a wildcard (*)';
  if (url.username !== '' || url.password !== '' || /^[a-z][a-z0-9+.-]*:\/\/[^/?]*@/i.test(value)) return 'must not contain user info';
  if (url.protocol === 'https:') return null;
  if (url.protocol === 'http:') {
    return LOOPBACK_HOSTS.has(url.hostname) ? null : 'http is allowed only for loopback hosts (localhost, 127.0.0.1, [::1]); use https';
  }
  return 'must use https (or http for a loopback host)';
}

export const redirectUriSchema = z.string().superRefine((value, ctx) => {
  const problem = redirectUriProblem(value);
  if (problem) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(value.slice(0, 100))} ${problem}` });
});

/** How many URIs an application may register in each list (the database checks it too). */
export const MAX_REDIRECT_URIS = 20;

/**
 * A registered list of URIs the browser may be sent to: the redirect URIs, and the post-logout
 * redirect URIs of RP-initiated logout, which follow the same rules and are compared the same
 * way. `noun` names the list in the error ("redirect URIs").
 */
export function redirectUriListSchema(noun: string) {
  return z.array(redirectUriSchema).max(MAX_REDIRECT_URIS, `at most ${MAX_REDIRECT_URIS} ${noun}`);
}

/**
 * The registered URI plus the response parameters. Appended as text, not through URL, so the
 * registered query stays exactly as registered; registered URIs have no fragment (AZ-10).
 */
export function redirectLocation(redirectUri: string, params: Record<string, string | undefined>): string {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) if (value !== undefined) query.append(name, value);
  const separator = !redirectUri.includes('?') ? '?' : /[?&]$/.test(redirectUri) ? '' : '&';
  // A header value must be ASCII; percent-encode anything else the registered URI holds.
  const base = redirectUri.replace(/[^\x21-\x7e]/gu, (c) => encodeURIComponent(c));
  const added = query.toString();
  return added === '' ? base : `${base}${separator}${added}`;
}

/**
 * Whether a request's redirect_uri is the registered one: byte for byte (RFC 9700 §2.1), except
 * that for an http loopback URI the port is not compared (RFC 8252 §7.3: a native app listens on
 * whatever port the system gives it). Everything else, the path and query included, must match.
 */
export function redirectUriMatches(registered: string, presented: string): boolean {
  if (registered === presented) return true;
  if (!registered.startsWith('http://') || !presented.startsWith('http://') || !URL.canParse(registered) || !URL.canParse(presented)) return false;
  const a = new URL(registered);
  const b = new URL(presented);
  if (!LOOPBACK_HOSTS.has(a.hostname) || a.hostname !== b.hostname) return false;
  // Compared as written apart from the port: the authority is rewritten without it, nothing else is normalized.
  const withoutPort = (value: string, url: URL) => value.replace(`//${url.host}`, `//${url.hostname}`);
  return withoutPort(registered, a) === withoutPort(presented, b) && /^http:\/\/(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?(\/|\?|$)/.test(presented);
}
