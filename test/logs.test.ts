/**
 * the logs never hold a password, client secret, code, code verifier, refresh token, access
 * token, session cookie or CSRF token. Every flow runs against one app whose pino output (at
 * level trace) is captured: sign-up and sign-in, failed sign-ins, authorization code with PKCE
 * through consent (and the browser arriving back with the code, on a redirect URI this server
 * hosts), token exchange, refresh, client_credentials with Basic and with client_secret_post,
 * introspection, revocation, API calls, the dashboard's Generate Token and Rotate secret, a
 * password change, failed client authentication, and error paths that put secrets where they
 * do not belong (the query string, JSON bodies, error objects, debug logging of a request's
 * input). Then no secret value may appear anywhere in the captured text.
 *
 * The test fails when the redaction in src/logger.ts is removed (its redact paths, the error
 * serializer's scrubbing or the URL masking of the request serializer).
 */
import { createHash } from 'node:crypto';
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../src/accounts/organizations.js';
import { createUser } from '../src/accounts/users.js';
import { type ApplicationWithSecret, createApplication } from '../src/oauth/models/applications.js';
import { ensureSigningKey } from '../src/oauth/models/signing-keys.js';
import { Browser, csrfTokenIn } from './accounts/browser.js';
import { buildTestApp, logCapture, TEST_SECRET_KEY, testConfig } from './helpers/app.js';
import { BACKEND, createTestDatabase } from './helpers/db.js';
import { basic, form } from './helpers/oauth.js';
import { confirmSignUp, nextMail, SIGN_UP_SUBJECT, signUpPath } from './helpers/sign-up.js';
import { TestSmtpServer } from './helpers/smtp.js';

const ISSUER = testConfig().issuer;
/** A redirect URI on this very server: the browser's request with ?code= lands in our logs. */
const CALLBACK = `${ISSUER}/callback`;
const PASSWORD = 'logs-Password-0123456789';
const NEW_PASSWORD = 'logs-New-Password-9876543210';
const SIGNUP_PASSWORD = 'logs-Signup-Password-ABCDEFGH';
const VERIFIER = 'logsVerifier-0123456789-abcdefghijklmnopqrstuvwxyz-._~';
const STATE = 'logs-state-0123456789';
const FORM = { 'content-type': 'application/x-www-form-urlencoded' };

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let smtp: TestSmtpServer;
let app: FastifyInstance;
let logs = logCapture();
let organizationId: number;
let email: string;
let publicApp: ApplicationWithSecret;
let privateApp: ApplicationWithSecret;

/** Every secret value the flows handled, with what it is (for the failure message). */
const secrets = new Map<string, string>();
function secret(value: unknown, what: string): string {
  if (typeof value !== 'string' || value.length < 8) throw new Error(`expected a ${what}, got ${String(value)}`);
  secrets.set(value, what);
  return value;
}
function rememberCookies(b: Browser, what: string): void {
  for (const [name, value] of b.cookies) if (value.length >= 8) secret(value, `${what} cookie ${name}`);
}

/** Basic credentials (base64 of id:secret): the header value is as secret as the secret. */
function basicAuth(clientId: string, clientSecret: string): string {
  const header = basic(clientId, clientSecret);
  secret(header.slice('Basic '.length), 'Basic credentials');
  return header;
}

const inject = (options: InjectOptions): Promise<LightMyRequestResponse> => app.inject({ remoteAddress: '10.8.0.1', ...options });
const tokenRequest = (fields: Record<string, string>, headers: Record<string, string> = {}, url = '/oauth/token') =>
  inject({ method: 'POST', url, headers: { ...FORM, ...headers }, payload: form(fields) });

/** A database and an app logging at trace in `format` to a fresh capture; the secrets of the last format forgotten. */
async function setUp(format: 'json' | 'pretty'): Promise<void> {
  logs = logCapture();
  secrets.clear();
  t = await createTestDatabase();
  const db = t.handle.db;
  await ensureSigningKey(db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  // Sign-up mails its link: to a mail server, so the link reaches the test and not the log.
  smtp = await TestSmtpServer.start();
  app = await buildTestApp(db, { logStream: logs.stream, env: { LOG_LEVEL: 'trace', LOG_FORMAT: format, REFRESH_REUSE_GRACE: '0', SMTP_URL: smtp.url } });
  // Code that mishandles a request's input, as a future handler might: throws an error carrying
  // the body, query and headers, or logs them at debug level. Redaction must hold for both.
  app.post('/test/fails-with-input', async (req) => {
    const rawBody = new URLSearchParams(req.body as Record<string, string>).toString();
    throw Object.assign(new Error('handler failed'), { body: req.body, query: req.query, headers: req.headers, cause: { body: req.body, payload: rawBody } });
  });
  app.post('/test/logs-input', async (req) => {
    req.log.debug({ body: req.body, query: req.query, headers: req.headers }, 'request input');
    return {};
  });
  await app.ready();

  const user = await createUser(db, { email: `logs-${process.pid}@example.com`, password: PASSWORD, name: 'Logs' });
  email = user.email;
  secret(PASSWORD, 'password');
  secret(NEW_PASSWORD, 'new password');
  secret(SIGNUP_PASSWORD, 'sign-up password');
  organizationId = (await createOrganization(db, { name: 'Logs Org', ownerUserId: user.id })).id;
  publicApp = await createApplication(db, { organizationId, type: 'public', name: 'Logs Web', redirectUris: [CALLBACK], requirePkce: true });
  privateApp = await createApplication(db, { organizationId, type: 'private', name: 'Logs Backend' });
  secret(publicApp.client_secret, 'public client secret');
  secret(privateApp.client_secret, 'private client secret');
  secret(VERIFIER, 'code verifier');
}

async function tearDown(): Promise<void> {
  await app?.close();
  await smtp?.stop();
  await t?.close();
}

/** Signs `b` in through the login page, recording the password, cookies and CSRF token. */
async function signIn(b: Browser, password = PASSWORD): Promise<LightMyRequestResponse> {
  const csrf = secret(await b.csrf('/login'), 'login CSRF token');
  rememberCookies(b, 'pre-session');
  const res = await b.post('/login', { email, password, csrf_token: csrf });
  rememberCookies(b, 'session');
  return res;
}

/** Authorization code with PKCE through the consent page; the browser then follows the redirect. */
async function authorize(b: Browser): Promise<string> {
  const query = form({
    client_id: publicApp.client_id, redirect_uri: CALLBACK, response_type: 'code', scope: 'contacts.read contacts.write', state: STATE, prompt: 'consent',
    code_challenge: createHash('sha256').update(VERIFIER).digest('base64url'), code_challenge_method: 'S256',
  });
  const consent = await b.get(`/oauth/authorize?${query}`);
  expect(consent.statusCode).toBe(200);
  const fields = Object.fromEntries([...consent.body.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)"/g)].map((m) => [m[1]!, m[2]!.replace(/&amp;/g, '&')]));
  secret(fields.csrf_token, 'consent CSRF token');
  const res = await b.post('/oauth/authorize', { ...fields, organization_id: String(organizationId), decision: 'approve' });
  expect(res.statusCode).toBe(303);
  const location = new URL(String(res.headers.location));
  const code = secret(location.searchParams.get('code'), 'authorization code');
  // The browser arrives back at the redirect URI, which this server happens to host (404 here).
  await b.get(`${location.pathname}${location.search}`);
  return code;
}

function rememberTokens(res: LightMyRequestResponse): { access_token: string; refresh_token?: string } {
  expect(res.statusCode, res.body).toBe(200);
  const body = res.json();
  secret(body.access_token, 'access token');
  if (body.refresh_token !== undefined) secret(body.refresh_token, 'refresh token');
  return body;
}

describe.each(['json', 'pretty'] as const)(`logs as %s on ${BACKEND} (R-8)`, (format) => {
  beforeAll(() => setUp(format), 60_000);
  afterAll(tearDown);

  it('run every flow at level trace', async () => {
    expect(app.log.level).toBe('trace');

    // Sign-up, then sign-in (and failed sign-ins) as the seeded user.
    const newcomer = new Browser(app, '10.8.1.1');
    const signupCsrf = secret(await newcomer.csrf('/signup'), 'sign-up CSRF token');
    rememberCookies(newcomer, 'pre-session');
    const newcomerEmail = `logs-new-${process.pid}@example.com`;
    const asked = await newcomer.post('/signup', { email: newcomerEmail, password: SIGNUP_PASSWORD, name: 'New', organization_name: 'New Org', csrf_token: signupCsrf });
    expect(asked.statusCode).toBe(200);
    // The mailed link: its token in the URL, then in the form the page posts.
    const link = signUpPath(await nextMail(smtp, newcomerEmail, SIGN_UP_SUBJECT, 0));
    secret(new URLSearchParams(link.split('?')[1]).get('token')!, 'sign-up link token');
    const signedUp = await confirmSignUp(newcomer, link, SIGNUP_PASSWORD);
    expect(signedUp.statusCode).toBe(303);
    rememberCookies(newcomer, 'session');

    const b = new Browser(app, '10.8.1.2');
    expect((await signIn(new Browser(app, '10.8.1.3'), 'wrong-password-1234567')).statusCode).toBe(400);
    const intruder = new Browser(app, '10.8.1.4');
    const intruderCsrf = secret(await intruder.csrf('/login'), 'login CSRF token');
    rememberCookies(intruder, 'pre-session');
    expect((await intruder.post('/login', { email: 'nobody@example.com', password: PASSWORD, csrf_token: intruderCsrf })).statusCode).toBe(400);
    expect((await signIn(b)).statusCode).toBe(303);

    // Authorization code + PKCE through consent, exchanged with client_secret_basic.
    const code = await authorize(b);
    const pkce = { grant_type: 'authorization_code', code, redirect_uri: CALLBACK, code_verifier: VERIFIER };
    const user = rememberTokens(await tokenRequest(pkce, { authorization: basicAuth(publicApp.client_id, publicApp.client_secret) }));

    // Refresh with client_secret_post, then the old refresh token again (reuse detection), then
    // the code again (a replay): both revoke the grant.
    const refreshed = rememberTokens(
      await tokenRequest({ grant_type: 'refresh_token', refresh_token: user.refresh_token!, client_id: publicApp.client_id, client_secret: publicApp.client_secret }),
    );
    expect(refreshed.refresh_token).not.toBe(user.refresh_token);
    expect(
      (await tokenRequest({ grant_type: 'refresh_token', refresh_token: user.refresh_token!, client_id: publicApp.client_id, client_secret: publicApp.client_secret })).statusCode,
    ).toBe(400);
    expect((await tokenRequest(pkce, { authorization: basicAuth(publicApp.client_id, publicApp.client_secret) })).json().error).toBe('invalid_grant');
    const second = await authorize(b);
    const other = rememberTokens(await tokenRequest({ ...pkce, code: second, client_id: publicApp.client_id, client_secret: publicApp.client_secret }));
    // A wrong verifier.
    const third = await authorize(b);
    expect((await tokenRequest({ ...pkce, code: third, code_verifier: `${VERIFIER}x` }, { authorization: basicAuth(publicApp.client_id, publicApp.client_secret) })).statusCode).toBe(400);

    // client_credentials, with Basic and with client_secret_post.
    const cc = { grant_type: 'client_credentials', organization_id: String(organizationId) };
    const ccBasic = rememberTokens(await tokenRequest(cc, { authorization: basicAuth(privateApp.client_id, privateApp.client_secret) }));
    const ccPost = rememberTokens(await tokenRequest({ ...cc, scope: 'contacts.read', client_id: privateApp.client_id, client_secret: privateApp.client_secret }));

    // Introspection and revocation of access and refresh tokens.
    const asPublic = { authorization: basicAuth(publicApp.client_id, publicApp.client_secret) };
    expect((await tokenRequest({ token: other.access_token }, asPublic, '/oauth/introspect')).json().active).toBe(true);
    expect((await tokenRequest({ token: other.refresh_token!, token_type_hint: 'refresh_token' }, asPublic, '/oauth/introspect')).json().active).toBe(true);
    expect((await tokenRequest({ token: ccPost.access_token, client_id: privateApp.client_id, client_secret: privateApp.client_secret }, {}, '/oauth/introspect')).statusCode).toBe(200);
    expect((await tokenRequest({ token: other.refresh_token! }, asPublic, '/oauth/revoke')).statusCode).toBe(200);
    expect((await tokenRequest({ token: refreshed.access_token }, asPublic, '/oauth/revoke')).statusCode).toBe(200);

    // The API with bearer tokens: allowed, refused (revoked, wrong organization, missing scope).
    const api = (token: string, method: 'GET' | 'POST', path: string, payload?: object) =>
      inject({ method, url: `/api/v1/${organizationId}${path}`, headers: { authorization: `Bearer ${token}` }, ...(payload ? { payload } : {}) });
    expect((await api(ccBasic.access_token, 'POST', '/contacts', { name: 'Ada', email: 'ada@example.com' })).statusCode).toBe(201);
    expect((await api(ccBasic.access_token, 'GET', '/contacts?limit=1')).statusCode).toBe(200);
    expect((await api(ccPost.access_token, 'POST', '/tasks', { title: 'x' })).statusCode).toBe(403);
    expect((await api(other.access_token, 'GET', '/contacts')).statusCode).toBe(401);
    expect((await inject({ method: 'GET', url: `/api/v1/${organizationId + 1000}/contacts`, headers: { authorization: `bearer ${ccBasic.access_token}` } })).statusCode).toBe(403);

    // The dashboard: Generate Token and Rotate secret (each shown once, in the page only), a password change.
    expect((await b.post('/dashboard/organization', { csrf_token: secret(await b.csrf('/dashboard'), 'dashboard CSRF token'), organization_id: String(organizationId) })).statusCode).toBe(303);
    const page = `/dashboard/applications/${privateApp.client_id}`;
    const generated = await b.post(`${page}/token`, { csrf_token: await b.csrf(page), scopes: ['contacts.read'] });
    expect(generated.statusCode).toBe(200);
    secret(/name="access_token"[^>]*>([^<]+)<\/textarea>/.exec(generated.body)?.[1], 'dashboard access token');
    const rotated = await b.post(`${page}/secret`, { csrf_token: await b.csrf(page), confirm: 'rotate' });
    expect(rotated.statusCode).toBe(200);
    const newSecret = secret(/name="client_secret" value="([^"]+)"/.exec(rotated.body)?.[1], 'rotated client secret');
    rememberTokens(await tokenRequest(cc, { authorization: basicAuth(privateApp.client_id, newSecret) }));
    expect((await b.post('/dashboard/account/password', { csrf_token: await b.csrf('/dashboard/account'), current_password: PASSWORD, new_password: NEW_PASSWORD })).statusCode).toBe(200);
    expect((await b.post('/dashboard/account/password', { csrf_token: await b.csrf('/dashboard/account'), current_password: PASSWORD, new_password: NEW_PASSWORD })).statusCode).toBe(400);

    // Failed client authentication (the old secret, a wrong one, an unknown client) until throttled.
    expect((await tokenRequest(cc, { authorization: basicAuth(privateApp.client_id, privateApp.client_secret) })).statusCode).toBe(401);
    expect((await tokenRequest({ ...cc, client_id: privateApp.client_id, client_secret: publicApp.client_secret })).statusCode).toBe(401);
    expect((await tokenRequest(cc, { authorization: basicAuth('0123456789abcdef0123456789abcdef', newSecret) })).statusCode).toBe(401);
    let throttled = 0;
    for (let i = 0; i < 12; i++) if ((await tokenRequest(cc, { authorization: basicAuth(privateApp.client_id, `${privateApp.client_secret}${i}`) })).statusCode === 429) throttled++;
    expect(throttled).toBeGreaterThan(0);

    // Error paths that put secrets where they do not belong.
    const secretsForm = { password: PASSWORD, client_secret: newSecret, code, code_verifier: VERIFIER, refresh_token: refreshed.refresh_token!, access_token: ccBasic.access_token };
    expect((await inject({ method: 'POST', url: `/oauth/token?${form({ client_id: privateApp.client_id, client_secret: newSecret, code })}`, headers: FORM, payload: form(cc) })).statusCode).toBe(400);
    expect((await inject({ method: 'GET', url: `/oauth/token?${form(secretsForm)}` })).statusCode).toBe(405);
    expect((await inject({ method: 'POST', url: '/oauth/token', headers: { 'content-type': 'application/json' }, payload: JSON.stringify({ ...cc, ...secretsForm }) })).statusCode).toBe(400);
    expect((await inject({ method: 'POST', url: '/oauth/token', headers: { 'content-type': 'application/json' }, payload: `{"client_secret":"${newSecret}",` })).statusCode).toBe(400);
    expect((await inject({ method: 'GET', url: `/api/v1/${organizationId}/contacts?access_token=${ccBasic.access_token}` })).statusCode).toBe(401);
    expect((await inject({ method: 'POST', url: `/api/v1/${organizationId}/contacts`, headers: { authorization: `Bearer ${ccBasic.access_token}`, 'content-type': 'application/json' }, payload: `{"name":"${newSecret}` })).statusCode).toBe(400);
    expect((await inject({ method: 'POST', url: '/login', headers: { 'content-type': 'application/json' }, payload: `{"email":"${email}","password":"${NEW_PASSWORD}"` })).statusCode).toBe(400);
    expect((await inject({ method: 'POST', url: '/login', headers: { 'content-type': 'application/json' }, payload: `password=${NEW_PASSWORD}` })).statusCode).toBe(400);
    expect((await inject({ method: 'POST', url: `/login?${form({ email, password: NEW_PASSWORD })}`, headers: FORM, payload: form({ email, password: NEW_PASSWORD }) })).statusCode).toBe(403);
    expect((await inject({ method: 'GET', url: `/no/such/page?${form(secretsForm)}`, headers: { authorization: `Bearer ${ccBasic.access_token}`, cookie: `orgauth_session=${[...b.cookies.values()][0]}` } })).statusCode).toBe(404);
    expect((await inject({ method: 'POST', url: '/oauth/revoke', headers: FORM, payload: `${form(secretsForm)}&pad=${'x'.repeat(70_000)}` })).statusCode).toBe(413);
    const mishandled = {
      url: `/test/fails-with-input?${form({ code, refresh_token: refreshed.refresh_token! })}`,
      headers: { ...FORM, authorization: basicAuth(privateApp.client_id, newSecret), cookie: `orgauth_session=${[...b.cookies.values()][0]}`, 'proxy-authorization': `Bearer ${ccBasic.access_token}` },
      payload: form({ ...secretsForm, csrf_token: signupCsrf, current_password: NEW_PASSWORD, new_password: SIGNUP_PASSWORD }),
    };
    expect((await inject({ method: 'POST', ...mishandled })).statusCode).toBe(500);
    expect((await inject({ method: 'POST', ...mishandled, url: mishandled.url.replace('fails-with-input', 'logs-input') })).statusCode).toBe(200);

    // Sign-out.
    expect((await b.post('/logout', { csrf_token: await b.csrf('/dashboard') })).statusCode).toBe(303);
  }, 60_000);

  it.runIf(format === 'json')('captured request logs, error logs and debug logs', () => {
    const lines = logs.lines().map((l) => JSON.parse(l) as Record<string, unknown>);
    const requests = lines.filter((l) => l.msg === 'incoming request').map((l) => l.req as { method: string; url: string });
    // Request lines carry method and URL with its query; a redirect URI hosted here got its code.
    expect(requests.some((r) => r.method === 'GET' && r.url.startsWith('/callback?code=[redacted]&state=logs-state-0123456789&iss='))).toBe(true);
    expect(requests.some((r) => r.method === 'POST' && /^\/oauth\/token\?client_id=[0-9a-f]{32}&client_secret=\[redacted\]&code=\[redacted\]$/.test(r.url))).toBe(true);
    expect(requests.some((r) => r.url.startsWith('/oauth/authorize?client_id='))).toBe(true);
    expect(lines.some((l) => l.msg === 'request completed' && typeof (l.res as { statusCode?: unknown })?.statusCode === 'number')).toBe(true);
    expect(lines.some((l) => l.msg === 'authorization code issued')).toBe(true);
    expect(lines.some((l) => l.msg === 'sign-in refused')).toBe(true);
    const failed = lines.find((l) => l.msg === 'unhandled error') as { err: { body: Record<string, unknown>; headers: Record<string, unknown> } } | undefined;
    expect(failed?.err.body.client_secret).toBe('[redacted]');
    expect(failed?.err.headers.authorization).toBe('[redacted]');
    const debug = lines.find((l) => l.msg === 'request input') as { level: number; body: Record<string, unknown> } | undefined;
    expect(debug?.level).toBe(20);
    expect(debug?.body.password).toBe('[redacted]');
    expect(secrets.size).toBeGreaterThan(25);
  });

  it.runIf(format === 'pretty')('are lines a person reads: time, level and the request on one line, errors over several, masked as in JSON', () => {
    const lines = logs.lines();
    const stamp = String.raw`^\[\d\d:\d\d:\d\d\.\d{3}\]`;
    expect(lines.filter((l) => l.startsWith('{'))).toEqual([]);
    const callback = new RegExp(`${stamp} INFO: GET /callback\\?code=\\[redacted\\]&state=${STATE}&iss=\\S+ from 10\\.8\\.\\d+\\.\\d+ incoming request \\{"request_id":"[^"]+"\\}$`);
    expect(lines.some((l) => callback.test(l)), lines.filter((l) => l.includes('/callback')).join('\n')).toBe(true);
    expect(lines.some((l) => new RegExp(`${stamp} INFO: \\d{3} in [\\d.]+ ms request completed`).test(l))).toBe(true);
    // An error: its fields and stack on lines of their own, its secrets masked.
    const error = lines.findIndex((l) => new RegExp(`${stamp} ERROR: unhandled error`).test(l));
    expect(error).toBeGreaterThan(-1);
    const entry = lines.slice(error + 1, lines.findIndex((l, i) => i > error && new RegExp(stamp).test(l))).join('\n');
    expect(entry).toMatch(/"stack":/);
    expect(entry).toMatch(/"client_secret": "\[redacted\]"/);
    expect(lines.some((l) => new RegExp(`${stamp} DEBUG: request input .*"password":"\\[redacted\\]"`).test(l))).toBe(true);
  });

  it('hold no password, client secret, code, verifier, token, session cookie or CSRF token', () => {
    const text = logs.lines().join('\n');
    const leaks = [...secrets].filter(([value]) => text.includes(value)).map(([value, what]) => {
      const line = logs.lines().find((l) => l.includes(value)) ?? '';
      return `${what} in: ${line.slice(0, 400)}`;
    });
    expect(leaks).toEqual([]);
  });
});
