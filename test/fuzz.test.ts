/**
 * Property-based fuzzing (R-7) of the OAuth endpoints, the consent form, the login page and the
 * API (the organization's data, and the management API) with fast-check: form bodies, query
 * strings, paths and headers, mixing random garbage with near-valid requests (real client
 * credentials, codes, refresh tokens, a signed-in session and its CSRF token, bearer tokens) so
 * the cases get past the first check. Every response must be a well-formed 2xx/3xx/4xx in the
 * shape its endpoint documents, never a 5xx or a hang.
 *
 * Each property runs FUZZ_RUNS cases (1,000 by default). The seed is printed at the start of the
 * file and fast-check prints seed and path of a failure; replay with FUZZ_SEED=<seed>.
 */
import { createHash } from 'node:crypto';
import fc from 'fast-check';
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../src/accounts/organizations.js';
import { createUser } from '../src/accounts/users.js';
import { CLIENT_ID_PATTERN, createApplication, type ApplicationWithSecret } from '../src/oauth/models/applications.js';
import { createAuthorizationCode } from '../src/oauth/models/authorization-codes.js';
import { createGrant } from '../src/oauth/models/grants.js';
import { ensureSigningKey } from '../src/oauth/models/signing-keys.js';
import { DATA_SCOPES, KNOWN_SCOPES, MANAGEMENT_SCOPES } from '../src/oauth/helpers/scopes.js';
import { Browser, csrfTokenIn } from './accounts/browser.js';
import { buildTestApp, TEST_SECRET_KEY, testConfig } from './helpers/app.js';
import { BACKEND, createTestDatabase } from './helpers/db.js';
import { basic, clientCredentialsToken, createOrgFixture, form, type OrgFixture, SAFE_DESCRIPTION } from './helpers/oauth.js';

const NUM_RUNS = Number(process.env.FUZZ_RUNS ?? 1000);
const SEED = process.env.FUZZ_SEED !== undefined ? Number(process.env.FUZZ_SEED) : (Date.now() ^ (Math.random() * 0x7fffffff)) | 0;
/** fast-check reports seed and path on failure; a case that takes 5 s counts as a hang. */
const RUN = { numRuns: NUM_RUNS, seed: SEED, timeout: 5_000 } as const;
const PROPERTY_TIMEOUT = 180_000;

const ISSUER = testConfig().issuer;
const PASSWORD = 'fuzz-password-123';
const REDIRECT = 'https://client.example.com/cb';
const QUERY_REDIRECT = 'https://client.example.com/cb?tenant=a%20b&x=1';
const VERIFIER = `${'v'.repeat(20)}-._~abcdefghijklmnopqrstuvwxyz`;
const CHALLENGE = createHash('sha256').update(VERIFIER).digest('base64url');
const STATE = 'state-0123456789abcdef';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let org: OrgFixture;
let otherOrg: OrgFixture;
let pkceApp: ApplicationWithSecret;
let disabledApp: ApplicationWithSecret;
let user: { id: number; email: string };
/** A signed-in browser (the user is a member of `org`) and its CSRF token for the consent form. */
let session: Browser;
let sessionCsrf: string;
/** A signed-out browser holding a pre-session cookie, and the login form's CSRF token for it. */
let visitor: Browser;
let loginCsrf: string;
/** Bearer tokens: every scope, one scope, another organization's, a user's. */
const bearers = { full: '', narrow: '', other: '', user: '' };
let contactId = 0;
let taskId = 0;
let otherContactId = 0;
let ownOrgId = 0;
/** A second signed-in browser for the login property (a sign-in there ends its session). */
let loginSession: Browser;
/** A new authorization code for the public application (PKCE when `challenge` is given). */
let newCode: (challenge: string | null) => Promise<string>;
/** Ids the API property created, for its DELETE cases. */
const createdContacts: number[] = [];
const createdTasks: number[] = [];
/** Tokens the token property obtained, with the client they were issued to. */
const tokens: { token: string; client: ApplicationWithSecret }[] = [];

/** Grown while the properties run: codes from the consent form, tokens from the token endpoint. */
const codes: string[] = [];
const refreshTokens: string[] = [];
const accessTokens: string[] = [];

/** Each case its own client address, so the failed-client-auth throttle does not hide deeper paths. */
let ipCounter = 0;
const nextIp = () => {
  const n = ++ipCounter;
  return `10.${(n >> 16) & 255}.${(n >> 8) & 255}.${n & 255}`;
};

/** `arb` once in `oneIn` cases, undefined otherwise (fc.option is the other way round). */
const rarely = <T>(arb: fc.Arbitrary<T>, oneIn: number): fc.Arbitrary<T | undefined> =>
  fc.oneof({ arbitrary: fc.constant(undefined), weight: oneIn - 1 }, { arbitrary: arb, weight: 1 });

const sessionCookie = () => [...session.cookies].map(([k, v]) => `${k}=${v}`).join('; ');
const visitorCookie = () => [...visitor.cookies].map(([k, v]) => `${k}=${v}`).join('; ');

beforeAll(async () => {
  console.log(`fuzz: ${NUM_RUNS} runs per property, seed ${SEED} (replay with FUZZ_SEED=${SEED}) on ${BACKEND}`);
  t = await createTestDatabase();
  const db = t.handle.db;
  await ensureSigningKey(db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  // Rate limits off: 1,000 API requests a minute would otherwise all be 429 after the 600th.
  app = await buildTestApp(db, { env: { API_RATE_LIMIT: '0' } });
  org = await createOrgFixture(db);
  otherOrg = await createOrgFixture(db);
  pkceApp = await createApplication(db, {
    organizationId: org.organizationId, type: 'public', name: 'PKCE app', redirectUris: [REDIRECT, QUERY_REDIRECT], requirePkce: true,
  });
  disabledApp = await createApplication(db, { organizationId: org.organizationId, type: 'public', name: 'Disabled', redirectUris: [REDIRECT] });
  await db.updateTable('applications').set({ disabled: true }).where('client_id', '=', disabledApp.client_id).execute();

  const u = await createUser(db, { email: 'fuzz-user@example.com', password: PASSWORD, name: 'Fuzz' });
  user = { id: u.id, email: u.email };
  await addMember(db, { organizationId: org.organizationId, userId: u.id, role: 'member' });
  ownOrgId = (await createOrganization(db, { name: 'Fuzz Own Org', ownerUserId: u.id })).id;

  session = new Browser(app, '10.250.0.1');
  expect((await session.login(user.email, PASSWORD)).statusCode).toBe(303);
  const consent = await session.get(
    `/oauth/authorize?${form({ client_id: org.publicApp.client_id, redirect_uri: REDIRECT, response_type: 'code', scope: 'contacts.read', state: STATE })}`,
  );
  expect(consent.statusCode).toBe(200);
  sessionCsrf = csrfTokenIn(consent.body);
  visitor = new Browser(app, '10.250.0.2');
  loginCsrf = await visitor.csrf('/login');
  loginSession = new Browser(app, '10.250.0.3');
  expect((await loginSession.login(user.email, PASSWORD)).statusCode).toBe(303);

  const publicApp = await db.selectFrom('applications').select('id').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow();
  newCode = (challenge: string | null) =>
    createAuthorizationCode(db, {
      organizationId: org.organizationId, applicationId: publicApp.id, userId: user.id, redirectUri: REDIRECT,
      scopes: ['contacts.read', 'tasks.read'], codeChallenge: challenge, ttlSeconds: 600,
    });
  await mintBearers();
  for (let i = 0; i < 4; i++) codes.push(await newCode(i % 2 === 0 ? CHALLENGE : null));

  const api = (token: string, organizationId: number, path: string, payload: object) =>
    app.inject({ method: 'POST', url: `/api/v1/${organizationId}${path}`, headers: { authorization: `Bearer ${token}` }, payload });
  contactId = (await api(bearers.full, org.organizationId, '/contacts', { name: 'Ada' })).json().id;
  taskId = (await api(bearers.full, org.organizationId, '/tasks', { title: 'Call Ada', contact_id: contactId })).json().id;
  otherContactId = (await api(bearers.other, otherOrg.organizationId, '/contacts', { name: 'Bob' })).json().id;
  expect([contactId, taskId, otherContactId].every((id) => typeof id === 'number')).toBe(true);
}, 120_000);

/**
 * New bearer tokens. The properties revoke tokens (and a private application's tokens share one
 * grant), so the API property mints its own before it starts.
 */
async function mintBearers(): Promise<void> {
  bearers.full = await clientCredentialsToken(app, org);
  bearers.narrow = await clientCredentialsToken(app, org, 'contacts.read');
  bearers.other = await clientCredentialsToken(app, otherOrg);
  const exchanged = await app.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(org.publicApp.client_id, org.publicApp.client_secret) },
    payload: form({ grant_type: 'authorization_code', code: await newCode(null), redirect_uri: REDIRECT }),
  });
  expect(exchanged.statusCode).toBe(200);
  bearers.user = exchanged.json().access_token;
  refreshTokens.push(exchanged.json().refresh_token);
}

afterAll(async () => {
  await app?.close();
  await t?.close();
});

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

/** Percent-encodes the UTF-8 bytes of `s` (lone surrogates become U+FFFD), as a form would. */
function pct(s: string, spaceAsPlus = false): string {
  let out = '';
  for (const byte of Buffer.from(s, 'utf8')) {
    const c = String.fromCharCode(byte);
    if (/[A-Za-z0-9\-._~]/.test(c)) out += c;
    else if (byte === 0x20 && spaceAsPlus) out += '+';
    else out += `%${byte.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

/** Raw text dropped into an encoded value: NUL, invalid UTF-8, broken escapes, separators, CR/LF. */
const INJECTIONS = ['%00', '%C3%28', '%E0%A4%A', '%FF%FE', '%ED%A0%80', '%C0%AF', '%F4%90%80%80', '%', '%zz', '%%', '+', '&', '=', '&&', '==', '%26', '%3D', '%0D%0A', ';', '#', '%23'];

const SPECIAL_VALUES = [
  '', ' ', '\u0000', 'a\u0000b', '\u202e', '\ufeff', '\ud800', '\udfff', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', 'ß', 'İ', '..', '../', '\\', '"', "'", '<script>alert(1)</script>',
  '%', '%00', 'null', 'undefined', 'true', '[]', '{}', '0', '-1', '+1', '1e3', '01', '1.0', ' 1', '0x1', 'NaN', 'Infinity',
  '9223372036854775807', '9223372036854775808', '18446744073709551616', '\r\n', 'a\r\nSet-Cookie: x=1', '__proto__', 'constructor',
];

/** Anything at all, weighted towards the values that broke servers before. */
const garbage: fc.Arbitrary<string> = fc.oneof(
  { arbitrary: fc.string({ maxLength: 40 }), weight: 3 },
  { arbitrary: fc.string({ unit: 'grapheme', maxLength: 20 }), weight: 2 },
  { arbitrary: fc.string({ unit: 'binary', maxLength: 20 }), weight: 2 },
  { arbitrary: fc.constantFrom(...SPECIAL_VALUES), weight: 3 },
  { arbitrary: fc.oneof(fc.integer(), fc.bigInt({ min: -(2n ** 70n), max: 2n ** 70n }), fc.double()).map(String), weight: 1 },
  { arbitrary: fc.constantFrom(130, 501, 2001, 4097, 10_000).map((n) => 'x'.repeat(n)), weight: 1 },
);

/** A near-valid value: one of `candidates` as is, or slightly wrong. */
function nearValue(candidates: () => readonly string[]): fc.Arbitrary<string> {
  const pick = fc.nat().map((i) => {
    const list = candidates();
    return list.length === 0 ? '' : list[i % list.length]!;
  });
  const mutated = fc.tuple(pick, fc.nat(9), fc.string({ unit: 'binary', minLength: 1, maxLength: 3 }), fc.nat()).map(([s, op, c, n]) => {
    const at = s.length === 0 ? 0 : n % s.length;
    switch (op) {
      case 0: return s + c;
      case 1: return s.slice(0, at);
      case 2: return s.toUpperCase();
      case 3: return `${s}\u0000`;
      case 4: return ` ${s}`;
      case 5: return `${s} `;
      case 6: return s + s;
      case 7: return s.slice(0, at) + c + s.slice(at + 1);
      case 8: return `${s}${'a'.repeat(3000)}`;
      default: return s.split('').reverse().join('');
    }
  });
  return fc.oneof({ arbitrary: pick, weight: 8 }, { arbitrary: mutated, weight: 3 }, { arbitrary: garbage, weight: 2 });
}

/** A value as it goes on the wire: well encoded, or encoded with something raw spliced in. */
function wireValue(value: fc.Arbitrary<string>): fc.Arbitrary<string> {
  return fc.oneof(
    { arbitrary: fc.tuple(value, fc.boolean()).map(([v, plus]) => pct(v, plus)), weight: 8 },
    {
      arbitrary: fc.tuple(value, fc.constantFrom(...INJECTIONS), fc.nat()).map(([v, inj, n]) => {
        const enc = pct(v);
        const at = enc.length === 0 ? 0 : n % (enc.length + 1);
        return enc.slice(0, at) + inj + enc.slice(at);
      }),
      weight: 2,
    },
  );
}

/** Parameter names that are not ours: prototype keys, bracket syntax, odd encodings. */
const EXTRA_NAMES = [
  '__proto__', '__proto__[admin]', '__proto__.admin', 'constructor', 'constructor[prototype][admin]', 'prototype', 'hasOwnProperty',
  'toString', 'valueOf', '', '[]', 'a[b][c]', '%00', '%C3%28', 'x%00y', 'state[]', 'scope[]', 'client_id[]', 'code[0]',
];

type Pair = [name: string, value: string];
type Spec = Record<string, () => readonly string[]>;

/** A name as sent: usually itself, sometimes with brackets, another case or percent-encoded. */
const wireName = (name: string): fc.Arbitrary<string> =>
  fc.oneof(
    { arbitrary: fc.constant(name), weight: 12 },
    { arbitrary: fc.constantFrom(`${name}[]`, `${name}[0]`, name.toUpperCase(), `${name} `, `${name}%00`, pct(name).replace(/^./, (c) => `%${c.charCodeAt(0).toString(16)}`)), weight: 1 },
  );

/**
 * A list of encoded `name=value` pairs for the parameters of `spec` (each present or absent),
 * extra parameters, and now and then one parameter repeated.
 */
function pairsArb(spec: Spec): fc.Arbitrary<Pair[]> {
  const fields = Object.entries(spec).map(([name, candidates]) =>
    fc.option(fc.tuple(wireName(name), wireValue(nearValue(candidates))), { freq: 5, nil: undefined }),
  );
  const extra = fc.tuple(
    fc.oneof(fc.constantFrom(...EXTRA_NAMES), fc.string({ maxLength: 10 }).map((s) => pct(s))),
    wireValue(garbage),
  );
  return fc
    .tuple(fc.tuple(...fields), fc.array(extra, { maxLength: 3 }), rarely(fc.nat(), 4), fc.boolean())
    .map(([present, extras, repeat, extrasFirst]) => {
      const own = present.filter((p): p is [string, string] => p !== undefined);
      const pairs = extrasFirst ? [...extras, ...own] : [...own, ...extras];
      if (repeat !== undefined && pairs.length > 0) pairs.push(pairs[repeat % pairs.length]!);
      return pairs;
    });
}

const joinPairs = (pairs: readonly Pair[]) => pairs.map(([n, v]) => (n === '' && v === '' ? '' : `${n}=${v}`)).join('&');

/** A form body: near-valid pairs (maybe with raw bytes or padding), or nothing like a form at all. */
function bodyArb(pairs: fc.Arbitrary<Pair[]>): fc.Arbitrary<string | Buffer> {
  return fc.oneof(
    { arbitrary: pairs.map(joinPairs), weight: 12 },
    {
      arbitrary: fc.tuple(pairs, fc.uint8Array({ minLength: 1, maxLength: 8 })).map(([p, bytes]) =>
        Buffer.concat([Buffer.from(`${joinPairs(p)}&x=`), Buffer.from(bytes)]),
      ),
      weight: 2,
    },
    { arbitrary: pairs.map((p) => `${joinPairs(p)}&pad=${'p'.repeat(66_000)}`), weight: 1 },
    { arbitrary: fc.string({ unit: 'binary', maxLength: 200 }), weight: 1 },
    { arbitrary: fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.from(b)), weight: 1 },
    { arbitrary: fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v) ?? 'null'), weight: 1 },
  );
}

const FORM = 'application/x-www-form-urlencoded';
const contentTypeArb: fc.Arbitrary<string | undefined> = fc.oneof(
  { arbitrary: fc.constant(FORM), weight: 24 },
  {
    arbitrary: fc.constantFrom(
      `${FORM}; charset=utf-8`, `${FORM};charset=ISO-8859-1`, FORM.toUpperCase(), ` ${FORM}`, 'application/json', 'text/plain',
      'multipart/form-data; boundary=x', 'application/x-www-form-urlencoded-x', 'application/octet-stream', '', ';', '*/*',
    ),
    weight: 3,
  },
  { arbitrary: fc.constant(undefined), weight: 1 },
);

/** What a header value may be on the wire (RFC 9110 field-value: VCHAR, SP, HTAB, obs-text). */
const headerChar = fc.oneof(
  { arbitrary: fc.integer({ min: 0x20, max: 0x7e }), weight: 10 },
  { arbitrary: fc.constant(0x09), weight: 1 },
  { arbitrary: fc.integer({ min: 0x80, max: 0xff }), weight: 1 },
).map((c) => String.fromCharCode(c));
const headerValue = fc.oneof(
  { arbitrary: fc.string({ unit: headerChar, maxLength: 60 }), weight: 6 },
  { arbitrary: fc.constantFrom(130, 1000, 8000).map((n) => 'h'.repeat(n)), weight: 1 },
);

/** Headers nobody asked for, and ones that change how a request is read. */
const EXTRA_HEADERS = [
  'x-forwarded-for', 'x-forwarded-proto', 'x-forwarded-host', 'x-real-ip', 'forwarded', 'accept', 'accept-encoding', 'accept-language',
  'accept-charset', 'origin', 'referer', 'cookie', 'content-encoding', 'content-language', 'expect', 'range', 'if-none-match', 'x-request-id',
  'x-http-method-override', 'host', 'content-length', 'transfer-encoding', 'proxy-authorization', 'x-b3-traceid',
];
const extraHeadersArb: fc.Arbitrary<Record<string, string>> = fc
  .array(
    fc.tuple(
      fc.oneof({ arbitrary: fc.constantFrom(...EXTRA_HEADERS), weight: 5 }, { arbitrary: fc.stringMatching(/^x-[a-z0-9-]{1,20}$/), weight: 1 }),
      fc.oneof({ arbitrary: headerValue, weight: 4 }, { arbitrary: fc.constantFrom('0', '5', '99999', '-1', 'chunked', 'gzip', 'identity, gzip', '100-continue', 'bytes=0-1'), weight: 2 }),
    ),
    { maxLength: 3 },
  )
  .map((entries) => Object.fromEntries(entries));

/** A JWT-shaped token: signed by nobody, with any header and payload. */
const forgedJwt = fc
  .tuple(
    fc.record({ alg: fc.constantFrom('none', 'HS256', 'ES256', 'RS256', 'EdDSA', 'ES512', ''), typ: fc.constantFrom('at+jwt', 'JWT', 'at+JWT'), kid: fc.option(garbage, { nil: undefined }) }),
    fc.oneof(fc.jsonValue({ maxDepth: 2 }), fc.record({ organization_id: fc.integer(), scope: garbage, exp: fc.integer(), grant_id: fc.integer() })),
    fc.string({ maxLength: 20 }),
  )
  .map(([header, payload, sig]) => {
    const b64 = (v: unknown) => Buffer.from(JSON.stringify(v) ?? 'null').toString('base64url');
    return `${b64(header)}.${b64(payload)}.${Buffer.from(sig).toString('base64url')}`;
  });

/** A token that was issued, or one that looks like it. */
const tokenValue = (pool: () => readonly string[]) =>
  fc.oneof({ arbitrary: nearValue(pool), weight: 4 }, { arbitrary: forgedJwt, weight: 2 }, { arbitrary: garbage, weight: 1 });

const METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'] as const;

// ---------------------------------------------------------------------------------------------
// What every response must look like
// ---------------------------------------------------------------------------------------------

const OAUTH_ERRORS = new Set(['invalid_request', 'invalid_client', 'invalid_grant', 'unauthorized_client', 'unsupported_grant_type', 'invalid_scope', 'unsupported_token_type']);
/** Errors without an RFC 6749 code answer with the code of their status (app.ts CODE_FOR_STATUS). */
const STATUS_ERRORS: Record<number, string> = { 413: 'request_too_large', 429: 'too_many_requests' };
/** The API's codes (src/api/auth.ts, src/errors.ts, app.ts CODE_FOR_STATUS). */
const API_ERRORS = new Set([
  'invalid_request', 'invalid_token', 'insufficient_scope', 'organization_mismatch', 'not_found', 'not_acceptable', 'request_too_large',
  'unsupported_media_type', 'too_many_requests',
]);
const AUTHORIZE_ERRORS = new Set(['invalid_request', 'unsupported_response_type', 'invalid_scope', 'unauthorized_client', 'access_denied', 'login_required', 'consent_required']);

/** What the cases of one property got, `status error` → count: printed, and checked for depth. */
class Outcomes {
  readonly counts = new Map<string, number>();
  record(res: LightMyRequestResponse, detail?: string): void {
    let key = String(res.statusCode);
    if (detail !== undefined) key += ` ${detail}`;
    else if (String(res.headers['content-type']).startsWith('application/json') && res.body !== '') {
      try {
        const body = JSON.parse(res.body) as { error?: unknown; error_description?: unknown; active?: unknown };
        if (typeof body.error === 'string') key += ` ${body.error}`;
        else if (typeof body.active === 'boolean') key += ` active=${body.active}`;
        // FUZZ_DETAIL=1 tells the reasons apart, to see which checks the cases stop at.
        if (process.env.FUZZ_DETAIL && typeof body.error_description === 'string') key += ` (${body.error_description.slice(0, 50)})`;
      } catch {
        // checked elsewhere
      }
    }
    this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
  }
  /** Fails unless every outcome in `expected` happened at least once: the cases went deep enough. */
  expectReached(name: string, expected: string[]): void {
    const seen = [...this.counts].sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k}: ${n}`).join(', ');
    console.log(`fuzz ${name}: ${seen}`);
    expect(expected.filter((e) => !this.counts.has(e)), `outcomes never reached (${seen})`).toEqual([]);
  }
}

/** The outcome of a page response: where a 303 goes (login, a local path, the client's code or error). */
function pageOutcome(res: LightMyRequestResponse): string | undefined {
  if (res.statusCode !== 303) return String(res.headers['content-type']).startsWith('text/html') ? 'html' : undefined;
  const location = String(res.headers.location);
  if (location.startsWith('/login')) return 'login';
  if (location.startsWith('/')) return 'local';
  const params = URL.canParse(location) ? new URL(location).searchParams : new URLSearchParams();
  return params.get('code') !== null ? 'code' : (params.get('error') ?? 'other');
}

function summary(req: InjectOptions, res: LightMyRequestResponse): string {
  const payload = req.payload === undefined ? '' : String(req.payload).slice(0, 300);
  return `${req.method} ${String(req.url).slice(0, 300)} ${JSON.stringify(req.headers ?? {}).slice(0, 300)} ${payload}\n→ ${res.statusCode} ${JSON.stringify(res.headers)} ${res.body.slice(0, 300)}`;
}

function check(condition: unknown, message: string, req: InjectOptions, res: LightMyRequestResponse): asserts condition {
  if (!condition) throw new Error(`${message}\n${summary(req, res)}`);
}

function parseJson(req: InjectOptions, res: LightMyRequestResponse): Record<string, unknown> {
  check(String(res.headers['content-type']).startsWith('application/json'), 'a JSON content type', req, res);
  let body: unknown;
  try {
    body = JSON.parse(res.body);
  } catch {
    check(false, 'a JSON body', req, res);
  }
  check(typeof body === 'object' && body !== null && !Array.isArray(body), 'a JSON object', req, res);
  return body as Record<string, unknown>;
}

/** The error shape of src/errors.ts: {error, error_description} (and details for validation). */
function checkErrorBody(req: InjectOptions, res: LightMyRequestResponse, allowed: (error: string) => boolean): void {
  const body = parseJson(req, res);
  const keys = Object.keys(body);
  check(keys.every((k) => k === 'error' || k === 'error_description' || k === 'details'), 'only error, error_description and details', req, res);
  check(typeof body.error === 'string' && /^[a-z_]+$/.test(body.error), 'an error code', req, res);
  check(allowed(body.error), `a documented error code, not ${String(body.error)}`, req, res);
  check(typeof body.error_description === 'string' && SAFE_DESCRIPTION.test(body.error_description), 'a safe error_description', req, res);
  if (body.details !== undefined) {
    check(
      Array.isArray(body.details) && body.details.every((d: unknown) => typeof d === 'object' && d !== null && typeof (d as { path?: unknown }).path === 'string' && typeof (d as { message?: unknown }).message === 'string'),
      'details as [{path, message}]',
      req,
      res,
    );
  }
}

function checkStatus(req: InjectOptions, res: LightMyRequestResponse, allowed: readonly number[]): void {
  check(res.statusCode < 500, 'never a 5xx', req, res);
  check(allowed.includes(res.statusCode), `a status among ${allowed.join(' ')}`, req, res);
}

/** /oauth/token, /oauth/revoke, /oauth/introspect: JSON, no-store, RFC 6749 §5.2 errors. */
function checkOAuthResponse(req: InjectOptions, res: LightMyRequestResponse): Record<string, unknown> | undefined {
  checkStatus(req, res, [200, 400, 401, 405, 413, 429]);
  check(res.headers['cache-control'] === 'no-store', 'Cache-Control: no-store (TK-2)', req, res);
  if (res.statusCode === 401) check(/^Basic /.test(String(res.headers['www-authenticate'])), 'a Basic challenge with 401 (TK-4)', req, res);
  if (res.statusCode === 405) check(res.headers.allow === 'POST', 'Allow: POST with 405', req, res);
  if (req.method === 'HEAD') return undefined;
  if (res.statusCode >= 400) {
    checkErrorBody(req, res, (e) => OAUTH_ERRORS.has(e) || STATUS_ERRORS[res.statusCode] === e);
    return undefined;
  }
  return parseJson(req, res);
}

/** HTML pages (login, consent, error pages): the security headers of AZ-7, HTML for anything with a body. */
function checkPageResponse(req: InjectOptions, res: LightMyRequestResponse): void {
  check(res.statusCode < 500, 'never a 5xx', req, res);
  check(res.statusCode === 200 || res.statusCode === 303 || (res.statusCode >= 400 && res.statusCode < 500), 'a 200, a 303 or a 4xx', req, res);
  if (!['/oauth/authorize', '/login'].includes(String(req.url).split('?')[0]!)) {
    // Not a page route at all (another path, or one the router cannot read): the JSON error.
    checkErrorBody(req, res, (e) => e === 'not_found' || e === 'invalid_request');
    return;
  }
  check(String(res.headers['x-frame-options']) === 'DENY', 'X-Frame-Options: DENY (AZ-7)', req, res);
  check(String(res.headers['content-security-policy']).includes("frame-ancestors 'none'"), "frame-ancestors 'none' (AZ-7)", req, res);
  check(res.headers['cache-control'] === 'no-store', 'Cache-Control: no-store (AZ-7)', req, res);
  if (res.statusCode === 303) {
    check(typeof res.headers.location === 'string' && res.headers.location !== '', 'a Location with 303', req, res);
  } else if (req.method !== 'HEAD') {
    check(String(res.headers['content-type']).startsWith('text/html'), 'an HTML page', req, res);
    check(res.body.startsWith('<!doctype html>'), 'an HTML document', req, res);
  }
}

/** A same-origin path (AZ-9): never another host, however spelled. */
function isLocalPath(location: string): boolean {
  return location.startsWith('/') && !location.startsWith('//') && !location.startsWith('/\\') && new URL(location, 'http://orgauth.invalid').origin === 'http://orgauth.invalid';
}

/** A redirect back to the client: a registered URI, then the error (or code), state and iss. */
function checkClientRedirect(req: InjectOptions, res: LightMyRequestResponse, allowCode: boolean): void {
  const location = String(res.headers.location);
  const registered = [REDIRECT, QUERY_REDIRECT].find((uri) => location.startsWith(`${uri}${uri.includes('?') ? '&' : '?'}`));
  check(registered !== undefined, 'a redirect to a registered redirect_uri', req, res);
  const params = new URL(location).searchParams;
  check(params.get('iss') === ISSUER, 'iss (RFC 9207)', req, res);
  const error = params.get('error');
  if (error === null) {
    check(allowCode && params.get('code') !== null, 'a code (consent POST, or a remembered consent) or an error', req, res);
    codes.push(params.get('code')!);
  } else {
    check(AUTHORIZE_ERRORS.has(error), `an authorization error code, not ${error}`, req, res);
    check(SAFE_DESCRIPTION.test(params.get('error_description') ?? ''), 'a safe error_description', req, res);
    check(params.get('code') === null, 'no code with an error', req, res);
  }
}

// ---------------------------------------------------------------------------------------------
// Near-valid requests: a valid request, then up to three mutations
// ---------------------------------------------------------------------------------------------

type Field = [name: string, value: string];

interface Mutation {
  kind: number;
  at: number;
  value: string;
  injection: string;
  extraName: string;
}

const mutationArb: fc.Arbitrary<Mutation> = fc.record({
  kind: fc.nat(12),
  at: fc.nat(),
  value: garbage,
  injection: fc.constantFrom(...INJECTIONS),
  extraName: fc.oneof({ arbitrary: fc.constantFrom(...EXTRA_NAMES), weight: 3 }, { arbitrary: fc.string({ maxLength: 8 }).map((n) => pct(n)), weight: 1 }),
});
/** No mutation at all a third of the time: the valid request itself must work, and sets up state. */
const mutationsArb = fc.oneof({ arbitrary: fc.constant([] as Mutation[]), weight: 1 }, { arbitrary: fc.array(mutationArb, { minLength: 1, maxLength: 3 }), weight: 2 });

/** Encodes `fields` and applies `mutations` on the wire: wrong, missing, repeated, array-shaped, extra, raw. */
function mutate(fields: readonly Field[], mutations: readonly Mutation[]): Pair[] {
  const pairs: Pair[] = fields.map(([n, v]) => [pct(n), pct(v, true)]);
  for (const m of mutations) {
    const i = pairs.length === 0 ? -1 : m.at % pairs.length;
    const target = i >= 0 ? pairs[i] : undefined;
    if (m.kind === 5) {
      pairs.splice(m.at % (pairs.length + 1), 0, [m.extraName, pct(m.value)]); // an extra parameter
      continue;
    }
    if (target === undefined) continue;
    switch (m.kind) {
      case 0: target[1] = pct(m.value); break; // a wrong value
      case 1: pairs.splice(i, 1); break; // a missing parameter
      case 2: pairs.push([target[0], target[1]]); break; // sent twice, same value
      case 3: pairs.push([target[0], pct(m.value)]); break; // sent twice, another value
      case 4: target[0] = `${target[0]}${m.at % 2 === 0 ? '[]' : '[0]'}`; break; // array syntax
      case 6: { // raw text spliced in: NUL, invalid UTF-8, broken escapes, separators
        const at = m.at % (target[1].length + 1);
        target[1] = target[1].slice(0, at) + m.injection + target[1].slice(at);
        break;
      }
      case 7: target[1] = ''; break; // empty counts as absent
      case 8: target[1] = `${target[1]}%00`; break;
      case 9: target[1] = target[1].toUpperCase(); break; // a near miss
      case 10: target[1] = target[1].slice(0, Math.floor(target[1].length / 2)); break; // truncated, maybe mid-escape
      case 11: target[1] = `${target[1]}${'a'.repeat(m.at % 2 === 0 ? 5_000 : 70_000)}`; break; // long, or over the body limit
      default: target[0] = target[0].toUpperCase(); // the name's case
    }
  }
  return pairs;
}

type BodyShape = { kind: 'form' } | { kind: 'bytes'; bytes: Uint8Array } | { kind: 'other'; body: string | Buffer };
/** A body for `pairs`: usually the form, sometimes with raw bytes after it, now and then anything. */
const bodyShapeArb: fc.Arbitrary<BodyShape> = fc.oneof(
  { arbitrary: fc.constant<{ kind: 'form' }>({ kind: 'form' }), weight: 14 },
  { arbitrary: fc.uint8Array({ minLength: 1, maxLength: 8 }).map((bytes) => ({ kind: 'bytes' as const, bytes })), weight: 1 },
  { arbitrary: bodyArb(fc.constant([])).map((body) => ({ kind: 'other' as const, body })), weight: 1 },
);
function shapeBody(pairs: readonly Pair[], shape: BodyShape): string | Buffer {
  if (shape.kind === 'form') return joinPairs(pairs);
  if (shape.kind === 'bytes') return Buffer.concat([Buffer.from(`${joinPairs(pairs)}&x=`), Buffer.from(shape.bytes)]);
  return shape.body;
}

// ---------------------------------------------------------------------------------------------
// Client credentials, shared by the token, revocation and introspection properties
// ---------------------------------------------------------------------------------------------

const CREDENTIAL_MODES = ['wrong-secret', 'other-client', 'both', 'none', 'query', 'header-garbage', 'basic-garbage', 'basic-mismatch', 'basic-bad-escape'] as const;
const credentialsArb = fc.record({
  mode: fc.oneof({ arbitrary: fc.constant('valid' as const), weight: 12 }, { arbitrary: fc.constantFrom(...CREDENTIAL_MODES), weight: 4 }),
  post: fc.boolean(),
  junk: garbage,
  header: headerValue,
});
type CredentialsCase = typeof credentialsArb extends fc.Arbitrary<infer T> ? T : never;

/** RFC 6749 §2.3.1 Basic credentials for any strings (lone surrogates too, unlike encodeURIComponent). */
const basicFor = (id: string, secret: string) => `Basic ${Buffer.from(`${pct(id, true)}:${pct(secret, true)}`).toString('base64')}`;

const otherClient = (client: ApplicationWithSecret) => (client === org.publicApp ? org.privateApp : org.publicApp);

/** The credentials of `client` (or a mistake about them) on a request: headers, body pairs, query. */
function credentials(c: CredentialsCase, client: ApplicationWithSecret): { headers: Record<string, string>; pairs: Pair[]; query: string } {
  const other = otherClient(client);
  const sent = (app: { client_id: string }, secret: string): { headers: Record<string, string>; pairs: Pair[]; query: string } =>
    c.post ? { headers: {}, pairs: [['client_id', pct(app.client_id)], ['client_secret', pct(secret)]] as Pair[], query: '' } : { headers: { authorization: basicFor(app.client_id, secret) }, pairs: [], query: '' };
  switch (c.mode) {
    case 'valid': return sent(client, client.client_secret);
    case 'wrong-secret': return sent(client, c.junk);
    case 'other-client': return sent(other, other.client_secret);
    case 'both': return { headers: { authorization: basicFor(client.client_id, client.client_secret) }, pairs: [['client_id', client.client_id], ['client_secret', pct(client.client_secret)]], query: '' };
    case 'none': return { headers: {}, pairs: [], query: '' };
    case 'query': return { headers: {}, pairs: [], query: form({ client_id: client.client_id, client_secret: client.client_secret }) };
    case 'header-garbage': return { headers: { authorization: c.header }, pairs: [], query: '' };
    case 'basic-garbage': return { headers: { authorization: `Basic ${Buffer.from(c.junk).toString('base64')}` }, pairs: [], query: '' };
    case 'basic-mismatch': return { headers: { authorization: basicFor(client.client_id, client.client_secret) }, pairs: [['client_id', other.client_id]], query: '' };
    default: return { headers: { authorization: `Basic ${Buffer.from(`${client.client_id}:%${c.junk}`).toString('base64')}` }, pairs: [], query: '' };
  }
}

/** The envelope of a form-endpoint request: method, path, content type, extra headers, query noise. */
const envelopeArb = (path: string) =>
  fc.record({
    method: fc.oneof({ arbitrary: fc.constant('POST' as const), weight: 25 }, { arbitrary: fc.constantFrom(...METHODS), weight: 1 }),
    path: fc.oneof({ arbitrary: fc.constant(path), weight: 30 }, { arbitrary: fc.constantFrom(`${path}/`, path.toUpperCase(), `${path}%00`, `${path}/%ZZ`), weight: 1 }),
    contentType: contentTypeArb,
    extraHeaders: extraHeadersArb,
    query: rarely(pairsArb({ scope: () => ['contacts.read'], code: () => codes, access_token: () => accessTokens }).map(joinPairs), 12),
    shape: bodyShapeArb,
  });
type Envelope = typeof envelopeArb extends (path: string) => fc.Arbitrary<infer T> ? T : never;

function formRequest(e: Envelope, creds: ReturnType<typeof credentials>, pairs: Pair[]): InjectOptions {
  const query = [creds.query, e.query ?? ''].filter((q) => q !== '').join('&');
  return {
    method: e.method,
    url: query === '' ? e.path : `${e.path}?${query}`,
    headers: { ...e.extraHeaders, ...(e.contentType === undefined ? {} : { 'content-type': e.contentType }), ...creds.headers },
    payload: shapeBody([...creds.pairs, ...pairs], e.shape),
    remoteAddress: nextIp(),
  };
}

/** Checks a response from a path that is not exactly the endpoint's (another route or none). */
function checkOtherPath(req: InjectOptions, res: LightMyRequestResponse): void {
  checkStatus(req, res, [400, 401, 404, 405, 413, 415, 429]);
  if (req.method !== 'HEAD') checkErrorBody(req, res, (e) => OAUTH_ERRORS.has(e) || ['not_found', 'unsupported_media_type'].includes(e) || STATUS_ERRORS[res.statusCode] === e);
}

const isEndpoint = (req: InjectOptions, path: string) => req.url === path || String(req.url).startsWith(`${path}?`);

/** Drops the payload of a GET or HEAD (light-my-request would send it; a browser would not). */
function injectable(req: InjectOptions): InjectOptions {
  if (req.method === 'GET' || req.method === 'HEAD') {
    const { payload: _payload, ...rest } = req;
    return rest;
  }
  return req;
}

/** A change to a JSON body: a wrong value, a missing key, an unknown or prototype key, a repeated key, a key's case, array-shaped. */
interface JsonMutation {
  kind: number;
  at: number;
  value: unknown;
  key: string;
}

/** `body` as a JSON object after `mutations`, written by hand so that a key can be there twice. */
function jsonBody(body: readonly [string, unknown][], mutations: readonly JsonMutation[]): string {
  const entries: [string, unknown][] = body.map(([k, v]) => [k, v]);
  for (const m of mutations) {
    const i = m.at % Math.max(entries.length, 1);
    if (m.kind === 0 && entries[i]) entries[i][1] = m.value; // a wrong type or value
    else if (m.kind === 1) entries.splice(i, 1); // a missing field
    else if (m.kind === 2) entries.push([m.key, m.value]); // an unknown or prototype key
    else if (m.kind === 3 && entries[i]) entries.push([entries[i][0], m.value]); // a repeated key
    else if (m.kind === 4 && entries[i]) entries[i][0] = entries[i][0].toUpperCase();
    else if (entries[i]) entries[i][1] = [entries[i][1]]; // array-shaped
  }
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v) ?? 'null'}`).join(',')}}`;
}

// ---------------------------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------------------------

const SCOPES = ['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'];
const scopeArb = fc.option(fc.subarray(SCOPES, { minLength: 1 }).map((s) => s.join(' ')), { freq: 2, nil: undefined });

/** A refresh token that still works: the last one a refresh returned, or a new grant's. */
let liveRefresh: string | undefined;
async function freshRefreshToken(): Promise<string> {
  if (liveRefresh !== undefined) return liveRefresh;
  const res = await app.inject({
    method: 'POST',
    url: '/oauth/token',
    headers: { 'content-type': FORM, authorization: basic(org.publicApp.client_id, org.publicApp.client_secret) },
    payload: form({ grant_type: 'authorization_code', code: await newCode(null), redirect_uri: REDIRECT }),
  });
  liveRefresh = res.json().refresh_token as string;
  return liveRefresh;
}

describe(`fuzzing on ${BACKEND} (R-7)`, () => {
  it(`POST /oauth/token: ${NUM_RUNS} form bodies, queries and headers`, async () => {
    const spec: Spec = {
      grant_type: () => ['client_credentials', 'authorization_code', 'refresh_token', 'password', 'implicit', 'urn:ietf:params:oauth:grant-type:device_code'],
      organization_id: () => [String(org.organizationId), String(otherOrg.organizationId), '0', '01'],
      scope: () => ['contacts.read', 'contacts.read tasks.read', 'openid', 'contacts.read  tasks.read', 'contacts.read\ttasks.read'],
      code: () => codes,
      redirect_uri: () => [REDIRECT, `${REDIRECT}/`, QUERY_REDIRECT],
      code_verifier: () => [VERIFIER, 'short', 'x'.repeat(129)],
      refresh_token: () => refreshTokens,
      client_id: () => [org.privateApp.client_id, org.publicApp.client_id],
    };
    const caseArb = fc.oneof(
      {
        arbitrary: fc.record({
          kind: fc.constant('near' as const),
          grant: fc.constantFrom('client_credentials', 'authorization_code', 'authorization_code+pkce', 'refresh_token'),
          scope: scopeArb,
          mutations: mutationsArb,
          creds: credentialsArb,
          envelope: envelopeArb('/oauth/token'),
        }),
        weight: 5,
      },
      { arbitrary: fc.record({ kind: fc.constant('random' as const), pairs: pairsArb(spec), creds: credentialsArb, envelope: envelopeArb('/oauth/token') }), weight: 1 },
    );
    const outcomes = new Outcomes();
    await fc.assert(
      fc.asyncProperty(caseArb, async (c) => {
        let client = org.privateApp;
        let fields: Field[] = [];
        let refreshing = false;
        if (c.kind === 'near') {
          if (c.grant === 'client_credentials') {
            fields = [['grant_type', 'client_credentials'], ['organization_id', String(org.organizationId)]];
            if (c.scope !== undefined) fields.push(['scope', c.scope]);
          } else if (c.grant === 'refresh_token') {
            client = org.publicApp;
            refreshing = true;
            fields = [['grant_type', 'refresh_token'], ['refresh_token', await freshRefreshToken()]];
            if (c.scope !== undefined) fields.push(['scope', c.scope]);
          } else {
            client = org.publicApp;
            const pkce = c.grant === 'authorization_code+pkce';
            fields = [['grant_type', 'authorization_code'], ['code', await newCode(pkce ? CHALLENGE : null)], ['redirect_uri', REDIRECT]];
            if (pkce) fields.push(['code_verifier', VERIFIER]);
          }
        }
        const pairs = c.kind === 'near' ? mutate(fields, c.mutations) : c.pairs;
        const req = formRequest(c.envelope, credentials(c.creds, client), pairs);
        const res = await app.inject(injectable(req));
        outcomes.record(res);
        if (refreshing) liveRefresh = undefined;
        if (!isEndpoint(req, '/oauth/token')) return checkOtherPath(req, res);
        const body = checkOAuthResponse(req, res);
        if (body !== undefined && res.statusCode === 200) {
          check(typeof body.access_token === 'string' && body.token_type === 'Bearer' && typeof body.expires_in === 'number', 'a token response', req, res);
          check(typeof body.organization_id === 'number' && typeof body.organization_name === 'string', 'the organization in the token response', req, res);
          tokens.push({ token: body.access_token as string, client: body.refresh_token === undefined ? org.privateApp : org.publicApp });
          accessTokens.push(body.access_token as string);
          if (typeof body.refresh_token === 'string') {
            refreshTokens.push(body.refresh_token);
            tokens.push({ token: body.refresh_token, client: org.publicApp });
            if (refreshing) liveRefresh = body.refresh_token;
          }
        }
      }),
      RUN,
    );
    if (NUM_RUNS >= 1000) {
      outcomes.expectReached('token', [
        '200', '400 invalid_request', '401 invalid_client', '400 invalid_grant', '400 invalid_scope', '400 unsupported_grant_type',
        '400 unauthorized_client', '405 invalid_request', '413 request_too_large',
      ]);
    }
  }, PROPERTY_TIMEOUT);

  it(`POST /oauth/revoke and /oauth/introspect: ${NUM_RUNS} requests`, async () => {
    const forged = fc.oneof(forgedJwt, garbage);
    const caseArb = fc.record({
      endpoint: fc.constantFrom('/oauth/revoke', '/oauth/introspect', '/oauth/introspect'),
      token: fc.oneof(
        { arbitrary: fc.nat().map((i) => ({ pick: i })), weight: 6 },
        { arbitrary: fc.constant({ fresh: true }), weight: 2 },
        { arbitrary: fc.constantFrom('narrow', 'other', 'user').map((k) => ({ bearer: k as keyof typeof bearers })), weight: 1 },
        { arbitrary: forged.map((value) => ({ value })), weight: 2 },
      ),
      hint: fc.option(fc.constantFrom('access_token', 'refresh_token', 'id_token', 'ACCESS_TOKEN'), { freq: 3, nil: undefined }),
      mutations: mutationsArb,
      creds: credentialsArb,
      envelope: fc.constantFrom('/oauth/revoke', '/oauth/introspect').chain((p) => envelopeArb(p)),
    });
    const outcomes = new Outcomes();
    await fc.assert(
      fc.asyncProperty(caseArb, async (c) => {
        let token: string;
        let client = org.privateApp;
        if ('pick' in c.token && tokens.length > 0) ({ token, client } = tokens[c.token.pick % tokens.length]!);
        else if ('bearer' in c.token) {
          token = bearers[c.token.bearer];
          client = c.token.bearer === 'user' ? org.publicApp : c.token.bearer === 'other' ? otherOrg.privateApp : org.privateApp;
        }
        else if ('value' in c.token) token = c.token.value;
        else token = await clientCredentialsToken(app, org, 'contacts.read');
        const fields: Field[] = [['token', token]];
        if (c.hint !== undefined) fields.push(['token_type_hint', c.hint]);
        const envelope = { ...c.envelope, path: c.envelope.path.replace(/^\/oauth\/(revoke|introspect)/i, c.endpoint) };
        const req = formRequest(envelope, credentials(c.creds, client), mutate(fields, c.mutations));
        const res = await app.inject(injectable(req));
        outcomes.record(res);
        if (!isEndpoint(req, c.endpoint)) return checkOtherPath(req, res);
        const body = checkOAuthResponse(req, res);
        if (body !== undefined && res.statusCode === 200) {
          if (c.endpoint === '/oauth/revoke') check(Object.keys(body).length === 0, 'an empty object from /oauth/revoke', req, res);
          else {
            check(typeof body.active === 'boolean', 'active in an introspection response', req, res);
            if (body.active === false) check(Object.keys(body).length === 1, 'exactly {"active": false} (MD-2)', req, res);
            else {
              const authenticated = c.creds.mode === 'other-client' ? otherClient(client) : client;
              check(body.client_id === authenticated.client_id, "only the client's own tokens are active to it (MD-2)", req, res);
            }
          }
        }
      }),
      RUN,
    );
    if (NUM_RUNS >= 1000) outcomes.expectReached('revoke/introspect', ['200', '200 active=false', '200 active=true', '400 invalid_request', '401 invalid_client']);
  }, PROPERTY_TIMEOUT);

  const authorizeSpec: Spec = {
    client_id: () => [org.publicApp.client_id, pkceApp.client_id, org.privateApp.client_id, disabledApp.client_id, otherOrg.publicApp.client_id],
    redirect_uri: () => [REDIRECT, QUERY_REDIRECT, `${REDIRECT}/`, 'HTTPS://client.example.com/cb', `${REDIRECT}?x=1`, 'https://evil@client.example.com/cb', 'javascript:alert(1)'],
    response_type: () => ['code', 'token', 'code id_token', 'none'],
    scope: () => ['contacts.read', 'contacts.read tasks.read', 'contacts.read contacts.write tasks.read tasks.write', 'openid', 'contacts.read  tasks.read'],
    state: () => [STATE, 'short', 's'.repeat(512), 'ßtate-ünïcødé-0123456789-𝔘', `${STATE}&iss=evil`],
    code_challenge: () => [CHALLENGE, 'short', `${CHALLENGE}!`, 'a'.repeat(129)],
    code_challenge_method: () => ['S256', 'plain', 's256'],
  };
  /** A valid authorization request (RFC 6749 §4.1.1), for the plain or the PKCE application. */
  const authorizeFieldsArb = fc
    .record({
      pkce: fc.boolean(),
      queryRedirect: fc.boolean(),
      scope: fc.subarray(['contacts.read', 'contacts.write', 'tasks.read', 'tasks.write'], { minLength: 1 }),
      state: fc.oneof({ arbitrary: fc.constant(STATE), weight: 3 }, { arbitrary: fc.constantFrom('s'.repeat(512), 'ßtate-ünïcødé-0123456789-𝔘', `${STATE}&iss=evil#x`), weight: 1 }, { arbitrary: fc.string({ unit: 'grapheme', minLength: 16, maxLength: 40 }), weight: 1 }),
    })
    .map(({ pkce, queryRedirect, scope, state }): Field[] => [
      ['client_id', pkce ? pkceApp.client_id : org.publicApp.client_id],
      ['redirect_uri', pkce && queryRedirect ? QUERY_REDIRECT : REDIRECT],
      ['response_type', 'code'],
      ['scope', scope.join(' ')],
      ['state', state],
      ...(pkce ? ([['code_challenge', CHALLENGE], ['code_challenge_method', 'S256']] as Field[]) : []),
    ]);
  const cookieArb = fc.oneof({ arbitrary: fc.constant('session'), weight: 8 }, { arbitrary: fc.constant('none'), weight: 2 }, { arbitrary: fc.constant('garbage'), weight: 1 });
  const junkCookie = fc.string({ unit: headerChar, maxLength: 40 }).map((s) => s.replace(/[;,\s]/g, ''));
  const cookieHeader = (kind: string, junk: string): Record<string, string> =>
    kind === 'session' ? { cookie: sessionCookie() } : kind === 'garbage' ? { cookie: `orgauth_session=${junk}; orgauth_csrf=${junk}` } : {};

  it(`GET /oauth/authorize: ${NUM_RUNS} query strings, signed in or not`, async () => {
    const caseArb = fc.record({
      pairs: fc.oneof({ arbitrary: fc.tuple(authorizeFieldsArb, mutationsArb).map(([f, m]) => mutate(f, m)), weight: 5 }, { arbitrary: pairsArb(authorizeSpec), weight: 1 }),
      path: fc.oneof({ arbitrary: fc.constant('/oauth/authorize'), weight: 30 }, { arbitrary: fc.constantFrom('/oauth/authorize/', '/oauth/Authorize', '/oauth/authorize%00', '/oauth/%E0%A4%A'), weight: 1 }),
      method: fc.oneof({ arbitrary: fc.constant('GET'), weight: 10 }, { arbitrary: fc.constant('HEAD'), weight: 1 }),
      cookie: cookieArb,
      junk: junkCookie,
      extra: extraHeadersArb,
    });
    const outcomes = new Outcomes();
    await fc.assert(
      fc.asyncProperty(caseArb, async (c) => {
        const req: InjectOptions = { method: c.method, url: `${c.path}?${joinPairs(c.pairs)}`, headers: { ...c.extra, ...cookieHeader(c.cookie, c.junk) }, remoteAddress: nextIp() };
        const res = await app.inject(req);
        outcomes.record(res, pageOutcome(res));
        checkPageResponse(req, res);
        if (res.statusCode === 303) {
          const location = String(res.headers.location);
          if (location.startsWith('/login?return_to=')) check(c.cookie !== 'session', 'the login page only when signed out (AZ-6)', req, res);
          // A code straight from GET only for a signed-in user who approved this application before (remembered consent).
          else checkClientRedirect(req, res, c.cookie === 'session');
        }
        if (res.statusCode === 200) check(c.cookie === 'session', 'the consent page only when signed in (AZ-6)', req, res);
      }),
      RUN,
    );
    if (NUM_RUNS >= 1000) outcomes.expectReached('authorize', ['200 html', '303 login', '303 invalid_request', '303 invalid_scope', '400 html']);
  }, PROPERTY_TIMEOUT);

  it(`POST /oauth/authorize (consent): ${NUM_RUNS} forms`, async () => {
    const spec: Spec = {
      ...authorizeSpec,
      csrf_token: () => [sessionCsrf, loginCsrf],
      decision: () => ['approve', 'deny', 'Approve', 'maybe'],
      organization_id: () => [String(org.organizationId), String(otherOrg.organizationId), '01'],
    };
    const consentFieldsArb = fc
      .tuple(
        authorizeFieldsArb,
        fc.oneof({ arbitrary: fc.constant('approve'), weight: 3 }, { arbitrary: fc.constant('deny'), weight: 1 }),
        fc.oneof({ arbitrary: fc.constant('member'), weight: 4 }, { arbitrary: fc.constantFrom('other', 'own'), weight: 1 }),
      )
      .map(([fields, decision, which]): Field[] => [
        ...fields,
        ['csrf_token', sessionCsrf],
        ['decision', decision],
        ['organization_id', String(which === 'member' ? org.organizationId : which === 'other' ? otherOrg.organizationId : ownOrgId)],
      ]);
    /** The same fields as JSON, with some values replaced by any JSON at all, and extra keys. */
    const jsonBodyArb = fc
      .tuple(consentFieldsArb, fc.array(fc.tuple(fc.nat(), fc.jsonValue({ maxDepth: 2 })), { maxLength: 2 }), fc.array(fc.tuple(fc.constantFrom(...EXTRA_NAMES), fc.jsonValue({ maxDepth: 2 })), { maxLength: 2 }))
      .map(([fields, replaced, extra]) => {
        const entries: [string, unknown][] = [...fields];
        for (const [at, value] of replaced) entries[at % entries.length]![1] = value;
        return `{${[...extra, ...entries].map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v) ?? 'null'}`).join(',')}}`;
      });
    const caseArb = fc.record({
      body: fc.oneof(
        { arbitrary: fc.tuple(consentFieldsArb, mutationsArb, bodyShapeArb).map(([f, m, shape]) => shapeBody(mutate(f, m), shape)), weight: 8 },
        { arbitrary: jsonBodyArb, weight: 1 },
        { arbitrary: bodyArb(pairsArb(spec)), weight: 2 },
      ),
      contentType: contentTypeArb,
      cookie: cookieArb,
      junk: junkCookie,
      extra: extraHeadersArb,
    });
    const outcomes = new Outcomes();
    await fc.assert(
      fc.asyncProperty(caseArb, async (c) => {
        const type = typeof c.body === 'string' && c.body.startsWith('{') ? 'application/json' : c.contentType;
        const req: InjectOptions = {
          method: 'POST',
          url: '/oauth/authorize',
          headers: { ...c.extra, ...cookieHeader(c.cookie, c.junk), ...(type === undefined ? {} : { 'content-type': type }) },
          payload: c.body,
          remoteAddress: nextIp(),
        };
        const res = await app.inject(req);
        outcomes.record(res, pageOutcome(res));
        checkPageResponse(req, res);
        if (res.statusCode === 303) {
          check(c.cookie === 'session', 'a redirect to the client only when signed in (AZ-6)', req, res);
          checkClientRedirect(req, res, true);
        }
      }),
      RUN,
    );
    if (NUM_RUNS >= 1000) outcomes.expectReached('consent', ['303 code', '303 access_denied', '303 invalid_request', '400 html', '403 html']);
  }, PROPERTY_TIMEOUT);

  it(`/login: ${NUM_RUNS} sign-in forms and return_to values`, async () => {
    const RETURN_TO = ['/dashboard', '/oauth/authorize?client_id=x', '//evil.example.com', '/\\evil.example.com', 'https://evil.example.com', '/%2F%2Fevil.example.com', '/\t/evil.example.com', 'javascript:alert(1)', '/dashboard?x=%ZZ'];
    const spec: Spec = {
      csrf_token: () => [loginCsrf, sessionCsrf],
      email: () => [user.email, user.email.toUpperCase(), 'nobody@example.com'],
      password: () => [PASSWORD, 'wrong-password', 'p'.repeat(1025)],
      return_to: () => RETURN_TO,
    };
    const loginFieldsArb = fc
      .record({
        // The right password is rare: each sign-in that gets as far as argon2 costs 100 ms.
        password: fc.oneof({ arbitrary: fc.constant(PASSWORD), weight: 1 }, { arbitrary: fc.constantFrom('wrong-password-1', 'p'.repeat(1025), ''), weight: 25 }),
        email: fc.oneof({ arbitrary: fc.constant(user.email), weight: 4 }, { arbitrary: fc.constantFrom(` ${user.email.toUpperCase()} `, 'nobody@example.com', 'x'.repeat(300)), weight: 1 }),
        returnTo: fc.option(fc.constantFrom(...RETURN_TO), { nil: undefined }),
      })
      .map(({ password, email, returnTo }): Field[] => [
        ['csrf_token', loginCsrf],
        ['email', email],
        ['password', password],
        ...(returnTo === undefined ? [] : ([['return_to', returnTo]] as Field[])),
      ]);
    const caseArb = fc.oneof(
      {
        arbitrary: fc.record({
          kind: fc.constant('get' as const),
          pairs: fc.tuple(fc.constantFrom(...RETURN_TO).map((r): Field[] => [['return_to', r]]), mutationsArb).map(([f, m]) => mutate(f, m)),
          cookie: fc.constantFrom('session', 'none', 'visitor'),
        }),
        weight: 1,
      },
      {
        arbitrary: fc.record({
          kind: fc.constant('post' as const),
          body: fc.oneof({ arbitrary: fc.tuple(loginFieldsArb, mutationsArb, bodyShapeArb).map(([f, m, shape]) => shapeBody(mutate(f, m), shape)), weight: 5 }, { arbitrary: bodyArb(pairsArb(spec)), weight: 1 }),
          contentType: contentTypeArb,
          cookie: fc.oneof({ arbitrary: fc.constant('visitor'), weight: 8 }, { arbitrary: fc.constantFrom('none', 'session'), weight: 1 }),
        }),
        weight: 3,
      },
    );
    const cookies = (kind: string): Record<string, string> =>
      kind === 'visitor' ? { cookie: visitorCookie() } : kind === 'session' ? { cookie: [...loginSession.cookies].map(([k, v]) => `${k}=${v}`).join('; ') } : {};
    const outcomes = new Outcomes();
    await fc.assert(
      fc.asyncProperty(caseArb, extraHeadersArb, async (c, extra) => {
        // One client address for every sign-in: after 20 failures it is throttled (429) rather than
        // spending argon2's 100 ms on each case.
        const req: InjectOptions =
          c.kind === 'get'
            ? { method: 'GET', url: `/login?${joinPairs(c.pairs)}`, headers: { ...extra, ...cookies(c.cookie) }, remoteAddress: '10.251.0.1' }
            : {
                method: 'POST',
                url: '/login',
                headers: { ...extra, ...cookies(c.cookie), ...(c.contentType === undefined ? {} : { 'content-type': c.contentType }) },
                payload: c.body,
                remoteAddress: '10.251.0.1',
              };
        const res = await app.inject(req);
        outcomes.record(res, res.body.includes('Incorrect email or password') ? 'refused' : pageOutcome(res));
        checkPageResponse(req, res);
        if (res.statusCode === 303) check(isLocalPath(String(res.headers.location)), 'a same-origin redirect (AZ-9)', req, res);
      }),
      RUN,
    );
    if (NUM_RUNS >= 1000) outcomes.expectReached('login', ['200 html', '303 local', '400 refused', '400 html', '403 html', '429 html']);
  }, PROPERTY_TIMEOUT);

  it(`/api/v1/...: ${NUM_RUNS} paths, queries, headers and JSON bodies`, async () => {
    await mintBearers();
    type Route = { method: string; path: string; query?: Field[]; body?: [string, unknown][] };
    const contactBody = fc.record(
      { name: fc.constantFrom('Ada Lovelace', 'Grace'), email: fc.constantFrom('ada@example.com', ''), phone: fc.constant('+44 1234'), company: fc.constant('Acme'), notes: fc.constant('note') },
      { requiredKeys: ['name'] },
    );
    const taskBody = fc.record(
      { title: fc.constantFrom('Call', 'Write'), description: fc.constant('d'), status: fc.constantFrom('open', 'done'), due_on: fc.constantFrom('2026-01-31', null), contact_id: fc.constant(0) },
      { requiredKeys: ['title'] },
    );
    /** A valid API request, chosen among the routes; ids and bodies filled in when the case runs. */
    const routeArb = fc.oneof(
      fc.constant({ method: 'GET', path: '' }),
      fc.record({ limit: fc.option(fc.constantFrom('1', '25', '100'), { nil: undefined }), q: fc.option(fc.constantFrom('Ada', 'a_b%', "O'Brien"), { nil: undefined }), cursor: fc.boolean() }).map(
        ({ limit, q, cursor }): Route => ({
          method: 'GET', path: '/contacts',
          query: [...(limit ? [['limit', limit] as Field] : []), ...(q ? [['q', q] as Field] : []), ...(cursor ? [['cursor', Buffer.from(JSON.stringify({ after: contactId })).toString('base64url')] as Field] : [])],
        }),
      ),
      contactBody.map((b): Route => ({ method: 'POST', path: '/contacts', body: Object.entries(b) })),
      fc.constant({ method: 'GET', path: '/contacts/:contact' }),
      contactBody.map((b): Route => ({ method: 'PATCH', path: '/contacts/:contact', body: Object.entries(b) })),
      fc.constant({ method: 'DELETE', path: '/contacts/:new-contact' }),
      fc.record({ status: fc.option(fc.constantFrom('open', 'done'), { nil: undefined }), contact: fc.boolean() }).map(
        ({ status, contact }): Route => ({ method: 'GET', path: '/tasks', query: [...(status ? [['status', status] as Field] : []), ...(contact ? [['contact_id', String(contactId)] as Field] : [])] }),
      ),
      taskBody.map((b): Route => ({ method: 'POST', path: '/tasks', body: Object.entries(b).map(([k, v]) => [k, k === 'contact_id' ? contactId : v]) })),
      fc.constant({ method: 'GET', path: '/tasks/:task' }),
      taskBody.map((b): Route => ({ method: 'PATCH', path: '/tasks/:task', body: Object.entries(b).map(([k, v]) => [k, k === 'contact_id' ? contactId : v]) })),
      fc.constant({ method: 'DELETE', path: '/tasks/:new-task' }),
    );
    const segmentMutation = fc.oneof(
      { arbitrary: fc.constant(undefined), weight: 10 },
      { arbitrary: nearValue(() => [String(otherOrg.organizationId), String(otherContactId), '0', '01', '-1', '1.0', '9223372036854775808', ' 1']).map((s) => pct(s)), weight: 2 },
      { arbitrary: fc.constantFrom('%ZZ', '%E0%A4%A', '%00', '..', '%2e%2e', 'a'.repeat(150), '', '%2F'), weight: 1 },
    );
    const bodyMutation = fc.record({ kind: fc.nat(6), at: fc.nat(), value: fc.oneof(fc.jsonValue({ maxDepth: 2 }), garbage, fc.constantFrom(null, 2 ** 60, -1, 0, 1.5, true, '2026-02-30', '0000-01-01', 'a\u0000b', 'x'.repeat(10_001))), key: fc.constantFrom('__proto__', 'constructor', 'prototype', 'id', 'organization_id', 'x') });
    const caseArb = fc.record({
      route: routeArb,
      orgSegment: segmentMutation,
      idSegment: segmentMutation,
      pathSuffix: fc.oneof({ arbitrary: fc.constant(''), weight: 20 }, { arbitrary: fc.constantFrom('/', '/x', '//'), weight: 1 }),
      method: fc.oneof({ arbitrary: fc.constant(undefined), weight: 20 }, { arbitrary: fc.constantFrom(...METHODS), weight: 1 }),
      queryMutations: fc.oneof({ arbitrary: fc.constant([] as Mutation[]), weight: 3 }, { arbitrary: fc.array(mutationArb, { minLength: 1, maxLength: 2 }), weight: 1 }),
      extraQuery: rarely(pairsArb({ limit: () => ['0', '101', '1.5', '1e2'], cursor: () => ['eyJhZnRlciI6LTF9', 'W10'], status: () => ['OPEN'], contact_id: () => ['01'], access_token: () => [bearers.full] }).map(joinPairs), 8),
      bodyMutations: fc.oneof({ arbitrary: fc.constant([]), weight: 2 }, { arbitrary: fc.array(bodyMutation, { minLength: 1, maxLength: 2 }), weight: 2 }),
      rawBody: rarely(
        fc.oneof(
          fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v) ?? 'null'),
          fc.string({ unit: 'binary', maxLength: 100 }),
          fc.uint8Array({ maxLength: 100 }).map((b) => Buffer.concat([Buffer.from('{"name":"'), Buffer.from(b), Buffer.from('"}')])),
          fc.constantFrom('{"name":"x","__proto__":{"admin":true}}', '{"title":"x","constructor":{"prototype":{"admin":true}}}', `{"name":"${'n'.repeat(70_000)}"}`, '{"name":', '[1,2]', 'name=x'),
        ),
        8,
      ),
      authorization: fc.oneof(
        { arbitrary: fc.constant('full'), weight: 16 },
        { arbitrary: fc.constantFrom('narrow', 'other', 'user', 'none', 'query-only'), weight: 3 },
        { arbitrary: fc.constantFrom('bearer', 'BEARER', 'Bearer  ', 'Basic', 'Token').map((scheme) => `${scheme} ${bearers.full}`), weight: 1 },
        { arbitrary: tokenValue(() => accessTokens).map((v) => `Bearer ${v}`), weight: 2 },
        { arbitrary: headerValue, weight: 1 },
      ),
      accept: rarely(fc.oneof({ arbitrary: fc.constantFrom('application/json', '*/*', 'application/*', 'text/html', 'application/json;q=0', 'text/html, application/json;q=0.1'), weight: 3 }, { arbitrary: headerValue, weight: 1 }), 4),
      contentType: rarely(fc.constantFrom('application/json; charset=utf-8', 'APPLICATION/JSON', 'text/plain', FORM, 'application/merge-patch+json', '', ';'), 10),
      extra: extraHeadersArb,
    });
    const outcomes = new Outcomes();
    await fc.assert(
      fc.asyncProperty(caseArb, async (c) => {
        const r = c.route as Route;
        const method = c.method ?? r.method;
        // A DELETE takes a row made for it (by an earlier case, or now), so it can succeed.
        const made = async (list: number[], path: string, body: object) =>
          list.pop() ?? ((await app.inject({ method: 'POST', url: `/api/v1/${org.organizationId}${path}`, headers: { authorization: `Bearer ${bearers.full}` }, payload: body })).json().id as number);
        const ids: Record<string, () => Promise<number>> = {
          ':contact': async () => contactId,
          ':task': async () => taskId,
          ':new-contact': () => made(createdContacts, '/contacts', { name: 'To delete' }),
          ':new-task': () => made(createdTasks, '/tasks', { title: 'To delete' }),
        };
        const idName = /:[a-z-]+/.exec(r.path)?.[0];
        const id = c.idSegment ?? (idName === undefined ? '' : String(await ids[idName]!()));
        const path = idName === undefined ? r.path : r.path.replace(idName, id);
        const query = [...(r.query ? [joinPairs(mutate(r.query, c.queryMutations))] : []), ...(c.extraQuery ? [c.extraQuery] : [])].filter((q) => q !== '').join('&');
        const url = `/api/v1/${c.orgSegment ?? org.organizationId}${path}${c.pathSuffix}${query === '' ? '' : `?${query}`}`;
        const headers: Record<string, string> = { ...c.extra };
        const auth = c.authorization;
        if (auth === 'full' || auth === 'narrow' || auth === 'other' || auth === 'user') headers.authorization = `Bearer ${bearers[auth]}`;
        else if (auth !== 'none' && auth !== 'query-only') headers.authorization = auth;
        if (c.accept !== undefined) headers.accept = c.accept;
        let payload: string | Buffer | undefined;
        if (c.rawBody !== undefined && method !== 'GET' && method !== 'HEAD') payload = c.rawBody;
        else if (r.body !== undefined) payload = jsonBody(r.body, c.bodyMutations);
        if (payload !== undefined) headers['content-type'] = c.contentType ?? 'application/json';
        const req: InjectOptions = { method: method as InjectOptions['method'], url, headers, ...(payload === undefined ? {} : { payload }), remoteAddress: nextIp() };
        const res = await app.inject(injectable(req));
        outcomes.record(res);
        checkStatus(req, res, [200, 201, 204, 400, 401, 403, 404, 406, 413, 414, 415]);
        if (res.statusCode === 401) check(String(res.headers['www-authenticate']).startsWith('Bearer realm="orgauth"'), 'a Bearer challenge with 401 (BR-1)', req, res);
        if (req.method === 'HEAD' || res.statusCode === 204) return;
        if (res.statusCode >= 400) {
          checkErrorBody(req, res, (e) => API_ERRORS.has(e));
          if (res.json().error === 'insufficient_scope') check(String(res.headers['www-authenticate']).includes('error="insufficient_scope"'), 'the insufficient_scope challenge (BR-2)', req, res);
          return;
        }
        const body = parseJson(req, res);
        if ('data' in body) check(Array.isArray(body.data) && (body.next_cursor === null || typeof body.next_cursor === 'string'), 'a list envelope', req, res);
        if (res.statusCode === 201 && typeof body.id === 'number') (path.startsWith('/contacts') ? createdContacts : createdTasks).push(body.id);
      }),
      RUN,
    );
    if (NUM_RUNS >= 1000) {
      outcomes.expectReached('api', [
        '200', '201', '204', '400 invalid_request', '401 invalid_token', '401 invalid_request', '403 insufficient_scope', '403 organization_mismatch',
        '404 not_found', '406 not_acceptable', '415 unsupported_media_type',
      ]);
    }
  }, PROPERTY_TIMEOUT);

  it(`/api/v1/... management API: ${NUM_RUNS} requests on applications, members, grants and the audit log`, async () => {
    const db = t.handle.db;
    // An organization whose integration holds every scope (AD-1: a private application's).
    const mgmt = await createOrgFixture(db, { scopes: KNOWN_SCOPES.join(' ') });
    const self = mgmt.privateApp.client_id;
    const mtok = {
      full: await clientCredentialsToken(app, mgmt),
      read: await clientCredentialsToken(app, mgmt, MANAGEMENT_SCOPES.filter((s) => s.endsWith('.read')).join(' ')),
      data: await clientCredentialsToken(app, mgmt, DATA_SCOPES.join(' ')),
      other: await clientCredentialsToken(app, otherOrg), // another organization's (data scopes only: it changes nothing there either)
    };
    /** The integration's own grant (its tokens share one): revoking it would turn every later case into a 401. */
    const grantOf = (jwt: string) => String(JSON.parse(Buffer.from(jwt.split('.')[1] ?? '', 'base64url').toString('utf8')).grant_id);
    const ownGrants = new Set([mtok.full, mtok.read, mtok.data].map(grantOf));
    const rowId = async (clientId: string) => (await db.selectFrom('applications').select('id').where('client_id', '=', clientId).executeTakeFirstOrThrow()).id;
    // Grants are made for an application the cases never name, so none of them disables or deletes it.
    const connected = await createApplication(db, { organizationId: mgmt.organizationId, type: 'public', name: 'Connected', redirectUris: [REDIRECT] });
    const connectedId = await rowId(connected.client_id);
    const otherGrant = (await createGrant(db, { organizationId: otherOrg.organizationId, applicationId: await rowId(otherOrg.publicApp.client_id), userId: otherOrg.ownerId, scopes: ['contacts.read'] }))!.id;
    const ownerEmail = (await db.selectFrom('users').select('email').where('id', '=', mgmt.ownerId).executeTakeFirstOrThrow()).email;
    let userCount = 0;
    // Users straight into the table: a real password hash would cost argon2's 100 ms each.
    const newUser = () =>
      db.insertInto('users').values({ email: `fuzz-mgmt-${++userCount}@example.com`, password_hash: '$argon2id$fuzz' }).returning(['id', 'email']).executeTakeFirstOrThrow();
    const existing = await newUser();
    await addMember(db, { organizationId: mgmt.organizationId, userId: existing.id, role: 'member' });

    const base = `/api/v1/${mgmt.organizationId}`;
    const asAdmin = { authorization: `Bearer ${mtok.full}` };
    /** Targets made for the cases (public applications, members, live grants), and the next_cursor each list gave. */
    const pools = { app: [] as string[], member: [] as string[], grant: [] as string[] };
    const cursors: Record<string, string[]> = {};
    const makeApp = async () => {
      const res = await app.inject({ method: 'POST', url: `${base}/applications`, headers: asAdmin, payload: { type: 'public', name: 'Target', redirect_uris: [REDIRECT] } });
      expect(res.statusCode, res.body).toBe(201);
      return res.json().client_id as string;
    };
    const makeMember = async () => {
      const u = await newUser();
      await addMember(db, { organizationId: mgmt.organizationId, userId: u.id, role: 'member' });
      return String(u.id);
    };
    const makeGrant = async () => String((await createGrant(db, { organizationId: mgmt.organizationId, applicationId: connectedId, userId: mgmt.ownerId, scopes: ['contacts.read'] }))!.id);
    const pick = async (pool: string[], n: number, make: () => Promise<string>) => pool[n % Math.max(pool.length, 1)] ?? (pool.push(await make()), pool.at(-1)!);

    type MRoute = { method: string; path: string; query?: Field[]; body?: [string, unknown][] };
    const listArb = (path: string) =>
      fc.record({ limit: fc.option(fc.constantFrom('1', '2', '25', '100'), { nil: undefined }), cursor: fc.constantFrom('none', 'none', 'issued', 'made') }).map(
        ({ limit, cursor }): MRoute => ({
          method: 'GET', path,
          query: [...(limit ? [['limit', limit] as Field] : []), ...(cursor === 'none' ? [] : [['cursor', `:${cursor}-cursor`] as Field])],
        }),
      );
    const newApplicationBody = fc.oneof(
      fc.record(
        { type: fc.constant('public'), name: fc.constantFrom('Made by fuzz', 'Ünïcødé 𝔘 app'), redirect_uris: fc.constantFrom([REDIRECT], [REDIRECT, 'http://localhost:8080/cb']), scopes: fc.constantFrom(['contacts.read'], [...DATA_SCOPES]), require_pkce: fc.boolean() },
        { requiredKeys: ['type', 'name', 'redirect_uris'] },
      ),
      fc.record({ type: fc.constant('private'), name: fc.constant('Fuzz integration'), scopes: fc.constantFrom(['applications.read'], [...KNOWN_SCOPES], ['tasks.read']) }, { requiredKeys: ['type', 'name'] }),
    );
    const applicationPatch = fc
      .record(
        { name: fc.constantFrom('Renamed', ' Trimmed '), redirect_uris: fc.constantFrom([REDIRECT], ['http://127.0.0.1:9000/cb']), scopes: fc.constantFrom(['contacts.read'], ['contacts.read', 'tasks.write']), require_pkce: fc.boolean(), disabled: fc.boolean() },
        { requiredKeys: [] },
      )
      .filter((b) => Object.keys(b).length > 0);
    /** A valid request, chosen among the routes; ids, emails and cursors filled in when the case runs. */
    const routeArb: fc.Arbitrary<MRoute> = fc.oneof(
      listArb('/applications'),
      fc.constantFrom<MRoute>({ method: 'GET', path: '/applications/:self' }, { method: 'GET', path: '/applications/:app' }),
      newApplicationBody.map((b): MRoute => ({ method: 'POST', path: '/applications', body: Object.entries(b) })),
      applicationPatch.map((b): MRoute => ({ method: 'PATCH', path: '/applications/:app', body: Object.entries(b) })),
      // The integration may not lock itself out: 409 (the body is only ever `disabled`).
      { arbitrary: fc.constantFrom<MRoute>({ method: 'PATCH', path: '/applications/:self', body: [['disabled', true]] }, { method: 'DELETE', path: '/applications/:self' }), weight: 2 },
      fc.constantFrom<MRoute>({ method: 'DELETE', path: '/applications/:new-app' }, { method: 'POST', path: '/applications/:app/secret' }),
      listArb('/members'),
      fc.constantFrom<MRoute>({ method: 'GET', path: '/members/:owner' }, { method: 'GET', path: '/members/:member' }, { method: 'DELETE', path: '/members/:new-member' }),
      // An application acts as an admin: an owner is for people to make, change or remove (403).
      fc.constantFrom<MRoute>({ method: 'DELETE', path: '/members/:owner' }, { method: 'PATCH', path: '/members/:owner', body: [['role', 'admin']] }),
      fc
        .record({ email: fc.constantFrom(':fresh-email', ':fresh-email', ':FRESH-EMAIL', ':member-email', ':owner-email', 'nobody@example.com'), role: fc.constantFrom('member', 'admin', 'admin', 'owner') })
        .map((b): MRoute => ({ method: 'POST', path: '/members', body: Object.entries(b) })),
      fc.constantFrom('member', 'admin', 'owner').map((role): MRoute => ({ method: 'PATCH', path: '/members/:member', body: [['role', role]] })),
      listArb('/grants'),
      fc.constantFrom<MRoute>({ method: 'GET', path: '/grants/:grant' }, { method: 'DELETE', path: '/grants/:new-grant' }),
      listArb('/audit-events'),
    );
    const segmentMutation = fc.oneof(
      { arbitrary: fc.constant(undefined), weight: 10 },
      {
        arbitrary: nearValue(() => [
          String(otherOrg.organizationId), String(org.organizationId), String(mgmt.ownerId), String(otherOrg.ownerId), String(user.id), String(otherGrant),
          // Never the integration's own client_id in lower case: a PATCH of it could narrow its scopes.
          otherOrg.publicApp.client_id, self.toUpperCase(), 'f'.repeat(32), '0', '01', '-1', '1.0', '1e1', '9223372036854775808', ' 1',
        ]).map((s) => pct(s)),
        weight: 2,
      },
      { arbitrary: fc.constantFrom('%ZZ', '%E0%A4%A', '%00', '..', '%2e%2e', 'a'.repeat(150), '', '%2F'), weight: 1 },
    );
    const bodyMutation: fc.Arbitrary<JsonMutation> = fc.record({
      kind: fc.nat(6),
      at: fc.nat(),
      value: fc.oneof(
        { arbitrary: fc.jsonValue({ maxDepth: 2 }), weight: 3 },
        { arbitrary: garbage, weight: 3 },
        {
          arbitrary: fc.constantFrom(null, 2 ** 60, -1, 0, true, false, [], {}, 'a\u0000b', '\ud800', 'x'.repeat(10_001), 'owner', 'OWNER', ' admin', ['contacts.read', 'contacts.read'], ['nope.read'], 'javascript:alert(1)', 'https://evil@client.example.com/cb', 'http://client.example.com/cb', 'a@b'),
          weight: 3,
        },
        { arbitrary: fc.constant('x'.repeat(70_000)), weight: 2 }, // over the body limit
      ),
      // Not `scopes`, `name` or `redirect_uris`: the integration's own PATCH body must stay `disabled`.
      key: fc.constantFrom('__proto__', 'constructor', 'prototype', 'id', 'organization_id', 'client_id', 'client_secret', 'user_id', 'type', 'x'),
    });
    const caseArb = fc.record({
      route: routeArb,
      pick: fc.nat(),
      cursorAfter: fc.oneof(fc.integer({ min: 1, max: 5_000 }), fc.constant(Number.MAX_SAFE_INTEGER)),
      orgSegment: segmentMutation,
      idSegment: segmentMutation,
      collection: rarely(fc.constantFrom('upper', 'nul', 'escaped', 'plural', 'short'), 25),
      pathSuffix: fc.oneof({ arbitrary: fc.constant(''), weight: 20 }, { arbitrary: fc.constantFrom('/', '/x', '//', '/secret'), weight: 1 }),
      method: fc.oneof({ arbitrary: fc.constant(undefined), weight: 20 }, { arbitrary: fc.constantFrom(...METHODS), weight: 1 }),
      queryMutations: fc.oneof({ arbitrary: fc.constant([] as Mutation[]), weight: 3 }, { arbitrary: fc.array(mutationArb, { minLength: 1, maxLength: 2 }), weight: 1 }),
      extraQuery: rarely(pairsArb({ limit: () => ['0', '101', '-1', '1.5', '1e2', '0x10', ' 5'], cursor: () => ['eyJhZnRlciI6LTF9', 'W10', 'x'.repeat(201)], access_token: () => [mtok.full] }).map(joinPairs), 8),
      bodyMutations: fc.oneof({ arbitrary: fc.constant([]), weight: 2 }, { arbitrary: fc.array(bodyMutation, { minLength: 1, maxLength: 2 }), weight: 2 }),
      rawBody: rarely(
        fc.oneof(
          fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v) ?? 'null'),
          fc.uint8Array({ maxLength: 100 }).map((b) => Buffer.concat([Buffer.from('{"name":"'), Buffer.from(b), Buffer.from('"}')])),
          fc.constantFrom('name', 'email', 'role', 'redirect_uris').map((key) => JSON.stringify({ [key]: 'x'.repeat(70_000) })), // over the body limit
          fc.constantFrom(
            `{"type":"public","name":"x","redirect_uris":["${REDIRECT}"],"__proto__":{"admin":true}}`,
            '{"email":"a@example.com","role":"admin","constructor":{"prototype":{"admin":true}}}',
            '{"role":"member","role":"owner"}', '{"role":["admin"]}', '{"email":["fuzz-mgmt-1@example.com"],"role":"member"}',
            '{"name":"a\\u0000b"}', '{"disabled":"true"}', `{"redirect_uris":"${REDIRECT}"}`, '{"scopes":"applications.read"}',
            `{"name":"${'n'.repeat(70_000)}"}`, '{"name":', '[1,2]', 'null', '"x"', 'role=admin', '',
          ),
        ),
        8,
      ),
      authorization: fc.oneof(
        { arbitrary: fc.constant('full'), weight: 16 },
        { arbitrary: fc.constantFrom('read', 'data', 'other', 'none'), weight: 4 },
        { arbitrary: fc.constantFrom('bearer', 'BEARER', 'Bearer  ', 'Basic', 'Token').map((scheme) => `${scheme} ${mtok.full}`), weight: 1 },
        { arbitrary: tokenValue(() => [mtok.full, mtok.read]).map((v) => `Bearer ${v}`), weight: 2 },
        { arbitrary: headerValue, weight: 1 },
      ),
      accept: rarely(fc.oneof({ arbitrary: fc.constantFrom('application/json', '*/*', 'text/html', 'application/json;q=0'), weight: 3 }, { arbitrary: headerValue, weight: 1 }), 6),
      contentType: rarely(fc.constantFrom('application/json; charset=utf-8', 'APPLICATION/JSON', 'text/plain', FORM, 'application/merge-patch+json', '', ';'), 10),
      extra: extraHeadersArb,
    });
    const COLLECTION: Record<string, (name: string) => string> = {
      upper: (n) => n.toUpperCase(),
      nul: (n) => `${n}%00`,
      escaped: (n) => `%${n.charCodeAt(0).toString(16)}${n.slice(1)}`,
      plural: (n) => `${n}s`,
      short: (n) => n.slice(0, -1),
    };
    const decode = (s: string) => {
      try {
        return decodeURIComponent(s);
      } catch {
        return s;
      }
    };
    const outcomes = new Outcomes();
    await fc.assert(
      fc.asyncProperty(caseArb, async (c) => {
        const r = c.route;
        const method = c.method ?? r.method;
        const ids: Record<string, () => Promise<string>> = {
          ':self': async () => self,
          ':app': () => pick(pools.app, c.pick, makeApp),
          ':new-app': async () => pools.app.pop() ?? makeApp(),
          ':owner': async () => String(mgmt.ownerId),
          ':member': () => pick(pools.member, c.pick, makeMember),
          ':new-member': async () => pools.member.pop() ?? makeMember(),
          ':grant': () => pick(pools.grant, c.pick, makeGrant),
          ':new-grant': async () => pools.grant.pop() ?? makeGrant(),
        };
        const idName = /:[a-z-]+/.exec(r.path)?.[0];
        let id = c.idSegment ?? (idName === undefined ? '' : await ids[idName]!());
        // Its own grant is the one thing the integration may revoke that ends every later case.
        if (method === 'DELETE' && r.path.startsWith('/grants/') && ownGrants.has(decode(id))) id = await makeGrant();
        const collection = r.path.split('/')[1]!;
        let path = idName === undefined ? r.path : r.path.replace(idName, id);
        if (c.collection !== undefined) path = `/${COLLECTION[c.collection]!(collection)}${path.slice(collection.length + 1)}`;
        const list = `/${collection}`;
        const fields = (r.query ?? []).map(([n, v]): Field => [
          n,
          v === ':issued-cursor' && cursors[list]?.length
            ? cursors[list][c.pick % cursors[list].length]!
            : v.endsWith('-cursor') ? Buffer.from(JSON.stringify({ after: c.cursorAfter })).toString('base64url') : v,
        ]);
        const query = [...(fields.length > 0 ? [joinPairs(mutate(fields, c.queryMutations))] : []), ...(c.extraQuery ? [c.extraQuery] : [])].filter((q) => q !== '').join('&');
        const url = `/api/v1/${c.orgSegment ?? mgmt.organizationId}${path}${c.pathSuffix}${query === '' ? '' : `?${query}`}`;
        // And still not through a spelling the router decodes (%35 for 5, a mutated collection name).
        const segments = url.split('?')[0]!.split('/').map(decode);
        if (method === 'DELETE' && segments.some((s, i) => i > 0 && segments[i - 1] === 'grants' && ownGrants.has(s))) return;

        const headers: Record<string, string> = { ...c.extra };
        const auth = c.authorization;
        if (auth === 'full' || auth === 'read' || auth === 'data' || auth === 'other') headers.authorization = `Bearer ${mtok[auth]}`;
        else if (auth !== 'none') headers.authorization = auth;
        if (c.accept !== undefined) headers.accept = c.accept;
        let payload: string | Buffer | undefined;
        if (c.rawBody !== undefined && method !== 'GET' && method !== 'HEAD') payload = c.rawBody;
        else if (r.body !== undefined) {
          const fresh = r.body.some(([, v]) => v === ':fresh-email' || v === ':FRESH-EMAIL') ? (await newUser()).email : '';
          const emails: Record<string, string> = { ':fresh-email': fresh, ':FRESH-EMAIL': fresh.toUpperCase(), ':member-email': existing.email, ':owner-email': ownerEmail };
          payload = jsonBody(r.body.map(([k, v]) => [k, typeof v === 'string' && v in emails ? emails[v] : v]), c.bodyMutations);
        }
        if (payload !== undefined) headers['content-type'] = c.contentType ?? 'application/json';
        const req: InjectOptions = { method: method as InjectOptions['method'], url, headers, ...(payload === undefined ? {} : { payload }), remoteAddress: nextIp() };
        const res = await app.inject(injectable(req));
        outcomes.record(res);
        // Where the request went, as the router reads it: ['', 'api', 'v1', organization, collection, id, ...].
        const sent = new URL(url, 'http://localhost');
        const resolved = sent.pathname.split('/').map(decode);
        const target = resolved[4] ?? '';
        checkStatus(req, res, [200, 201, 204, 400, 401, 403, 404, 406, 409, 413, 414, 415]);
        check(!res.body.includes(mgmt.privateApp.client_secret) && !res.body.includes('client_secret_hash'), 'no stored secret or secret hash in a response', req, res);
        if (res.statusCode === 401) check(String(res.headers['www-authenticate']).startsWith('Bearer realm="orgauth"'), 'a Bearer challenge with 401 (BR-1)', req, res);
        if (res.statusCode < 300) {
          // The organization itself (a path that resolves to it) needs no scope; the rest their route's.
          const token = String(req.headers?.authorization ?? '');
          const reads = method === 'GET' || method === 'HEAD';
          check(
            token.includes(mtok.full) || (token.includes(mtok.read) && reads) || (target === '' && token.includes(mtok.data)),
            'a 2xx only with a token holding the scope, for its own organization (BR-2, BR-3)', req, res,
          );
        }
        if (res.statusCode === 204 && method === 'DELETE') {
          // Gone: no later case picks it as a live target.
          for (const pool of Object.values(pools)) {
            const at = pool.indexOf(decode(id));
            if (at >= 0) pool.splice(at, 1);
          }
        }
        if (req.method === 'HEAD' || res.statusCode === 204) return;
        if (res.statusCode >= 400) {
          checkErrorBody(req, res, (e) => API_ERRORS.has(e) || e === 'conflict' || e === 'forbidden');
          const error = res.json().error;
          if (error === 'insufficient_scope') check(String(res.headers['www-authenticate']).includes('error="insufficient_scope"'), 'the insufficient_scope challenge (BR-2)', req, res);
          if (res.statusCode === 409) check(['PATCH', 'DELETE', 'POST'].includes(method) && ['applications', 'members'].includes(target), 'a 409 only where the API documents one', req, res);
          return;
        }
        const body = parseJson(req, res);
        const isApplication = (a: unknown) => typeof a === 'object' && a !== null && CLIENT_ID_PATTERN.test(String((a as { client_id?: unknown }).client_id)) && !('client_secret' in a);
        const ITEM: Record<string, (item: Record<string, unknown>) => boolean> = {
          applications: isApplication,
          members: (m) => typeof m.user_id === 'number' && ['owner', 'admin', 'member'].includes(String(m.role)) && typeof m.email === 'string',
          grants: (g) => typeof g.id === 'number' && typeof g.application === 'object' && Array.isArray(g.scopes),
          'audit-events': (e) => typeof e.id === 'number' && typeof e.action === 'string' && typeof e.actor === 'object',
          // `..` in a path: the client resolves it, to the organization itself.
          '': (o) => Object.keys(o).sort().join() === 'created_at,id,name,require_mfa' && o.id === mgmt.organizationId,
        };
        const item = ITEM[target];
        check(item !== undefined, 'a 2xx from a management route', req, res);
        if ('data' in body) {
          check(Array.isArray(body.data) && (body.next_cursor === null || typeof body.next_cursor === 'string'), 'a list envelope', req, res);
          check((body.data as Record<string, unknown>[]).every(item), 'list items of the documented shape', req, res);
          const limits = sent.searchParams.getAll('limit');
          const limit = limits.length === 0 ? 25 : limits.length === 1 && /^[0-9]+$/.test(limits[0]!) ? Number(limits[0]) : 100;
          check((body.data as unknown[]).length <= limit, 'no more items than the limit', req, res);
          if (typeof body.next_cursor === 'string') (cursors[list] ??= []).push(body.next_cursor);
          return;
        }
        if (resolved[6] === 'secret') {
          check(Object.keys(body).sort().join() === 'client_id,client_secret' && typeof body.client_secret === 'string', 'the new secret, and nothing else', req, res);
          return;
        }
        if (res.statusCode === 201 && target === 'applications') {
          const { client_secret: secret, ...shown } = body;
          check(typeof secret === 'string' && isApplication(shown) && res.headers.location === `${base}/applications/${String(body.client_id)}`, 'a new application with its secret and Location', req, res);
          if (body.type === 'public') pools.app.push(String(body.client_id));
          return;
        }
        check(item(body), `a ${target || 'organization'} item of the documented shape`, req, res);
        if (res.statusCode === 201) {
          check(res.headers.location === `${base}/members/${String(body.user_id)}`, 'the Location of a new member', req, res);
          pools.member.push(String(body.user_id));
        }
      }),
      RUN,
    );
    // The integration never locked itself out: it still reads and writes.
    expect((await app.inject({ method: 'GET', url: `${base}/applications/${self}`, headers: asAdmin })).json()).toMatchObject({ client_id: self, disabled: false, scopes: [...KNOWN_SCOPES] });
    if (NUM_RUNS >= 1000) {
      outcomes.expectReached('management', [
        '200', '201', '204', '400 invalid_request', '401 invalid_token', '401 invalid_request', '403 insufficient_scope', '403 organization_mismatch', '403 forbidden',
        '404 not_found', '406 not_acceptable', '409 conflict', '413 request_too_large', '415 unsupported_media_type',
      ]);
    }
  }, PROPERTY_TIMEOUT);
});
