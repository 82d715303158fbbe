/**
 * The bad-input battery for the single sign-on browser routes (issue 25, R-7): the email step of
 * POST /login, POST /sso/:id/start, the OIDC callback, the SAML ACS and metadata, /sso/finish (GET,
 * and the POST that confirms an IdP-initiated response) and /sso/link, each with hostile input. Every row states its exact status and what it may make in
 * the database: a refusal is a 4xx page (HTML, or the JSON error shape where the route answers
 * JSON, or the metadata route's plain "not found"), never a 5xx, a hang or a stack trace, and it
 * makes no session, no user, no identity link and no sso_sign_ins row. The few rows whose right
 * answer is to go on (an address that routes, a return_to that is replaced by the safe default)
 * say what they make and where they land.
 *
 * Decisions the rows pin down:
 * - `x@corp.example.` (a trailing dot, the DNS root) routes like corp.example: the domain is
 *   normalized (lower case, IDNA, no trailing dot) before it is looked up, so the dot can neither
 *   dodge the organization's identity provider nor SSO required. `x@bücher.example` and its
 *   xn-- form route alike; a look-alike in another script (`x@cоrp.example`, a Cyrillic о) is
 *   another domain and goes on to the password step.
 * - A lone surrogate percent-encoded as UTF-8 (%ED%A0%80) is not UTF-8: the form decoder leaves
 *   the whole value undecoded, so `a%ED%A0%80%40corp.example` has no @ and is no address (400),
 *   and `a%ED%A0%80@corp.example` is an address at corp.example like any other. Sent as raw
 *   bytes, each ill-formed byte reads as U+FFFD.
 * - A return_to or RelayState that is not a path of ours (`//evil.example`, `javascript:`) is
 *   replaced by /dashboard, at the start of the sign-in and at its end. An IdP-initiated response
 *   lands there only after the browser confirmed it (GET /sso/finish shows the question and signs
 *   nobody in; the POST with the page's CSRF token signs in).
 *
 * Found by this battery: GET /sso/2147483648/oidc/callback was a 500 (the id, 10 digits, passed
 * the route's pattern and reached an integer column); an id beyond 2^31 - 1 is now unknown.
 */
import { gzipSync } from 'node:zlib';
import type { InjectOptions, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUser } from '../../src/accounts/users.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { createConnection, updateConnection } from '../../src/sso/connections.js';
import { MAX_SAML_RESPONSE_BYTES } from '../../src/sso/saml-sp.js';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { BACKEND } from '../helpers/db.js';
import { createSamlIdp, type TestSamlIdp } from '../helpers/saml-idp.js';
import { pageText, type SsoOrganization, ssoOrganization, type SsoWorld, startSsoWorld, upstreamCallback } from '../helpers/sso-world.js';

const PASSWORD = 'a local password 123';
const FORM = 'application/x-www-form-urlencoded';

let world: SsoWorld;
/** corp.example verified, one active OIDC connection (and a second one, disabled). */
let corp: SsoOrganization;
let disabledConnectionId: number;
/** bücher.example (xn--bcher-kva.example) verified, one active OIDC connection. */
let idn: SsoOrganization;
/** saml.example verified, one active SAML connection that accepts IdP-initiated responses. */
let samlOrg: SsoOrganization;
let samlConnectionId: number;
let idp: TestSamlIdp;
/** A browser signed in with a password (to a user of no SSO organization), and its session's CSRF token. */
let signedIn: Client;
let sessionCsrf: string;

const db = () => world.db;

beforeAll(async () => {
  world = await startSsoWorld();
  corp = await ssoOrganization(world, { domain: 'corp.example', name: 'Corp Inc', connections: 2 });
  disabledConnectionId = corp.connectionIds[1]!;
  await updateConnection(db(), world.settings, corp.organizationId, disabledConnectionId, { state: 'disabled' });
  idn = await ssoOrganization(world, { domain: 'bücher.example', name: 'Bücher GmbH' });
  samlOrg = await ssoOrganization(world, { domain: 'saml.example', name: 'SAML Corp', connections: 0 });
  idp = createSamlIdp();
  samlConnectionId = (
    await createConnection(db(), world.settings, samlOrg.organizationId, {
      protocol: 'saml',
      name: 'SAML IdP',
      idp_entity_id: idp.entityId,
      idp_sso_url: idp.ssoUrl,
      idp_certificates: [idp.certificatePem],
      idp_initiated: true,
    })
  ).id;
  world.upstream.setAccount('eve', { sub: 'eve-sub', email: 'eve@corp.example', email_verified: true, name: 'Eve Upstream' });

  await createUser(db(), { email: 'local@elsewhere.example', password: PASSWORD, name: 'Local' });
  signedIn = client();
  const login = await signedIn.browser.login('local@elsewhere.example', PASSWORD);
  expect(login.statusCode, login.body).toBe(303);
  sessionCsrf = csrfTokenIn((await signedIn.browser.get('/dashboard/account')).body);
}, 60_000);
afterAll(async () => {
  await world?.close();
});

/** A browser of its own client address (the sign-in and refused-response throttles count per address), and a way to send it raw requests. */
interface Client {
  browser: Browser;
  ip: string;
  /** Sends `options` from this browser (its cookies, its address), the response's cookies not kept. */
  send(options: InjectOptions): Promise<LightMyRequestResponse>;
}

let addresses = 0;
function client(): Client {
  const i = ++addresses;
  const ip = `10.27.${Math.floor(i / 250)}.${(i % 250) + 1}`;
  const browser = new Browser(world.app, ip);
  return {
    browser,
    ip,
    send: (options) => {
      const cookie = [...browser.cookies].map(([k, v]) => `${k}=${v}`).join('; ');
      return world.app.inject({ ...options, headers: { ...(cookie === '' ? {} : { cookie }), ...options.headers }, remoteAddress: ip });
    },
  };
}

/** A browser that opened the login page: its pre-session cookie and the page's CSRF token. */
async function atLogin(): Promise<Client & { csrf: string }> {
  const c = client();
  return { ...c, csrf: await c.browser.csrf('/login') };
}

/** A raw form POST (the payload is sent as written: repeated keys, brackets, bad percent-encoding). */
const rawForm = (url: string, payload: string | Buffer, contentType = FORM): InjectOptions => ({ method: 'POST', url, headers: { 'content-type': contentType }, payload });

/** POST /login with the login page's CSRF token and `email` (encoded here unless `raw`). */
async function emailStep(email: string, raw = false): Promise<LightMyRequestResponse> {
  const c = await atLogin();
  return c.send(rawForm('/login', `csrf_token=${encodeURIComponent(c.csrf)}&${raw ? email : `email=${encodeURIComponent(email)}`}`));
}

/** POST /sso/:id/start with the login page's CSRF token. */
async function start(id: string, fields: Record<string, string> = {}): Promise<LightMyRequestResponse> {
  const c = await atLogin();
  return c.send(rawForm(`/sso/${id}/start`, new URLSearchParams({ csrf_token: c.csrf, ...fields }).toString()));
}

/** A GET from a browser that opened the login page (so it sends a pre-session cookie, as a browser coming back from its IdP does). */
async function getWithCookie(url: string): Promise<LightMyRequestResponse> {
  return (await atLogin()).send({ method: 'GET', url });
}

/** POST to the SAML ACS from a browser that never visited orgauth (the IdP's page posts cross-site). */
const acs = (id: string | number, payload: string | Buffer, contentType = FORM) => client().send(rawForm(`/sso/${id}/saml/acs`, payload, contentType));

/** An IdP-initiated response for `nameId` posted with `relayState` from a fresh browser: the browser and the /sso/finish URL the ACS sent it to. */
async function unsolicitedAtFinish(relayState: string, nameId = 'ivy@saml.example'): Promise<{ c: Client; finishUrl: string }> {
  const c = client();
  const urls = { entity: `${world.issuer}/sso/${samlConnectionId}/saml/metadata`, acs: `${world.issuer}/sso/${samlConnectionId}/saml/acs` };
  const response = await idp.respond({ spEntityId: urls.entity, acsUrl: urls.acs, nameId });
  const posted = await c.browser.post(`/sso/${samlConnectionId}/saml/acs`, { SAMLResponse: response, RelayState: relayState });
  expect(posted.statusCode, posted.body.slice(0, 300)).toBe(303);
  const finishUrl = String(posted.headers.location);
  expect(finishUrl).toMatch(/^\/sso\/finish\?handle=[A-Za-z0-9_-]{43}$/);
  return { c, finishUrl };
}

/**
 * An IdP-initiated response for `nameId` posted with `relayState`, then the /sso/finish it
 * redirects to in the same browser: the confirmation page (checked to sign nobody in), then its
 * form posted back; the POST's response.
 */
async function idpInitiated(relayState: string, nameId = 'ivy@saml.example'): Promise<LightMyRequestResponse> {
  const { c, finishUrl } = await unsolicitedAtFinish(relayState, nameId);
  const sessionsBefore = (await counts()).sessions;
  const page = await c.browser.get(finishUrl);
  expect(page.statusCode, page.body.slice(0, 300)).toBe(200);
  expect(pageText(page.body)).toContain(`Continue as ${nameId}`);
  expect(c.browser.cookies.has('orgauth_session')).toBe(false);
  expect((await counts()).sessions).toBe(sessionsBefore);
  const field = (name: string) => new RegExp(`name="${name}" value="([^"]*)"`).exec(page.body)?.[1] ?? '';
  return c.browser.post('/sso/finish', { csrf_token: field('csrf_token'), handle: field('handle') });
}

/** What the database holds of sign-ins: compared before and after each row. */
async function counts() {
  const count = async (table: 'sessions' | 'sso_sign_ins' | 'users' | 'sso_identities') =>
    Number((await db().selectFrom(table).select((eb) => eb.fn.countAll<number>().as('n')).executeTakeFirstOrThrow()).n);
  return { sessions: await count('sessions'), signIns: await count('sso_sign_ins'), users: await count('users'), identities: await count('sso_identities') };
}

type Body = 'html' | 'json' | 'text';

interface Row {
  name: string;
  request: () => Promise<LightMyRequestResponse>;
  status: number;
  /** What the body is: an HTML page (default), the JSON error shape, or the metadata route's plain text. */
  body?: Body;
  /** Text the page must say. */
  says?: string;
  /** Where a 303 goes: a path of ours, or the upstream OpenID provider (`upstream`, checked further by `check`). */
  location?: string | 'upstream';
  /** What the row may make (default: nothing). */
  makes?: Partial<Awaited<ReturnType<typeof counts>>>;
  check?: (res: LightMyRequestResponse) => void | Promise<void>;
}

const NOT_AN_EMAIL = 'Enter your email address.';
const NOT_AVAILABLE = 'This company sign-in is not available. Ask your administrator.';
const CSRF = 'This form has expired or did not come from this site.';
const BAD_LINK = 'This sign-in link is not valid. Start again.';
const EXPIRED = 'This sign-in has expired, was finished already, or was started in another browser.';
const INACTIVE = 'This company sign-in is not active. Ask your administrator.';
const NOT_COMPLETED = 'Your company sign-in could not be completed.';
const ONCE = 'was sent more than once';
/** Fastify's own refusals (body too large, no parser for the type, malformed JSON), as the pages' error page. */
const UNREADABLE = 'The request could not be processed.';
const NUL = 'contains a NUL character';

/** The authorization request the browser was sent to at the upstream provider. */
const authorizeUrl = (res: LightMyRequestResponse) => new URL(String(res.headers.location));

/** An email step that routes to corp.example's only active connection (and so starts one sign-in). */
const routesToCorp = (loginHint: string): Pick<Row, 'status' | 'location' | 'makes' | 'check'> => ({
  status: 303,
  location: 'upstream',
  makes: { signIns: 1 },
  check: (res) => {
    const url = authorizeUrl(res);
    expect(url.searchParams.get('client_id')).toBe(corp.clientIds[0]);
    expect(url.searchParams.get('login_hint')).toBe(loginHint);
  },
});

/** The email step going on to the password (no organization's identity provider for this address). */
const passwordStep = (email: string): Pick<Row, 'status' | 'check'> => ({
  status: 200,
  check: (res) => {
    expect(res.body).toContain('name="password"');
    expect(res.body).toContain(`name="email" value="${email}"`);
  },
});

const TEN_KB = 'x'.repeat(10_240);
const LONE_SURROGATE = '%ED%A0%80';

/** 100 MiB of zeros, gzipped (about 100 kB): a decompression bomb for anything that inflates what it is given. */
const gzipBomb = () => gzipSync(Buffer.alloc(100 * 1024 * 1024)).toString('base64');

const ROWS: Row[] = [
  // POST /login, the email step (no password field)
  { name: 'login: empty email', request: () => emailStep(''), status: 400, says: NOT_AN_EMAIL },
  { name: 'login: email of 300 characters at a verified domain', request: () => emailStep(`${'a'.repeat(300 - '@corp.example'.length)}@corp.example`), status: 400, says: NOT_AN_EMAIL },
  { name: 'login: not an email', request: () => emailStep('not an email'), status: 400, says: NOT_AN_EMAIL },
  { name: 'login: two addresses in one', request: () => emailStep('a@corp.example,b@corp.example'), status: 400, says: NOT_AN_EMAIL },
  { name: 'login: email[]=a&email[]=b', request: () => emailStep('email[]=a%40corp.example&email[]=b%40corp.example', true), status: 400, says: ONCE },
  { name: 'login: email=a&email=b', request: () => emailStep('email=a%40corp.example&email=b%40corp.example', true), status: 400, says: ONCE },
  { name: 'login: NUL in the email', request: () => emailStep('email=a%00%40corp.example', true), status: 400, says: NUL },
  { name: 'login: NUL after the domain', request: () => emailStep('email=a%40corp.example%00', true), status: 400, says: NUL },
  // Percent-encoding that is not UTF-8 is left undecoded by the form decoder: no @, not an address.
  { name: 'login: lone surrogate (UTF-8 %ED%A0%80) in the local part', request: () => emailStep(`email=a${LONE_SURROGATE}%40corp.example`, true), status: 400, says: NOT_AN_EMAIL },
  { name: 'login: lone surrogate in the domain', request: () => emailStep(`email=a%40corp${LONE_SURROGATE}.example`, true), status: 400, says: NOT_AN_EMAIL },
  { name: 'login: lone surrogate as %uD800', request: () => emailStep('email=a%uD800%40corp.example', true), status: 400, says: NOT_AN_EMAIL },
  // With a literal @ the value stays as sent (the % sequences undecoded): an address at corp.example like any other.
  { name: 'login: lone surrogate beside a literal @', request: () => emailStep(`email=a${LONE_SURROGATE}@corp.example`, true), ...routesToCorp(`a${LONE_SURROGATE}@corp.example`) },
  // The raw bytes (not percent-encoded) are read as UTF-8: each ill-formed byte is U+FFFD.
  {
    name: 'login: raw bytes of a lone surrogate in the body',
    request: async () => {
      const c = await atLogin();
      return c.send(rawForm('/login', Buffer.concat([Buffer.from(`csrf_token=${encodeURIComponent(c.csrf)}&email=a`), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('@corp.example')])));
    },
    ...routesToCorp('a\uFFFD\uFFFD\uFFFD@corp.example'),
  },
  { name: 'login: an IDN domain (bücher.example)', request: () => emailStep('anna@bücher.example'), status: 303, location: 'upstream', makes: { signIns: 1 }, check: (res) => expect(authorizeUrl(res).searchParams.get('client_id')).toBe(idn.clientIds[0]) },
  { name: 'login: the same domain in punycode (xn--bcher-kva.example)', request: () => emailStep('anna@xn--bcher-kva.example'), status: 303, location: 'upstream', makes: { signIns: 1 }, check: (res) => expect(authorizeUrl(res).searchParams.get('client_id')).toBe(idn.clientIds[0]) },
  { name: 'login: a look-alike of corp.example (Cyrillic о)', request: () => emailStep('x@c\u043Erp.example'), ...passwordStep('x@c\u043Erp.example') },
  { name: 'login: a trailing dot (x@corp.example.) routes like corp.example', request: () => emailStep('x@corp.example.'), ...routesToCorp('x@corp.example.') },
  { name: 'login: upper case (X@CORP.EXAMPLE) routes like corp.example', request: () => emailStep('X@CORP.EXAMPLE'), ...routesToCorp('X@CORP.EXAMPLE') },
  { name: 'login: two trailing dots go on to the password', request: () => emailStep('x@corp.example..'), ...passwordStep('x@corp.example..') },
  { name: 'login: a subdomain of a verified domain goes on to the password', request: () => emailStep('x@eu.corp.example'), ...passwordStep('x@eu.corp.example') },
  { name: 'login: the email step without a CSRF token', request: () => client().send(rawForm('/login', 'email=x%40corp.example')), status: 403, says: CSRF },

  // POST /sso/:id/start
  ...(['abc', '0', '-1', '2147483648', '99999999999', '1e3', '01', '1.0', '%201', '1%00'] as const).map(
    (id): Row => ({ name: `start: connection id ${id}`, request: () => start(id, { return_to: '/dashboard' }), status: 404, says: NOT_AVAILABLE }),
  ),
  { name: 'start: a disabled connection', request: () => start(String(disabledConnectionId)), status: 404, says: NOT_AVAILABLE },
  { name: 'start: no CSRF token', request: () => client().send(rawForm(`/sso/${corp.connectionId}/start`, 'return_to=%2Fdashboard')), status: 403, says: CSRF },
  {
    name: 'start: a pre-session cookie but no CSRF token',
    request: async () => (await atLogin()).send(rawForm(`/sso/${corp.connectionId}/start`, 'return_to=%2Fdashboard')),
    status: 403,
    says: CSRF,
  },
  {
    name: "start: another browser's CSRF token",
    request: async () => {
      const other = await atLogin();
      return (await atLogin()).send(rawForm(`/sso/${corp.connectionId}/start`, `csrf_token=${encodeURIComponent(other.csrf)}`));
    },
    status: 403,
    says: CSRF,
  },
  { name: 'start: a CSRF token of the wrong length', request: async () => (await atLogin()).send(rawForm(`/sso/${corp.connectionId}/start`, `csrf_token=${'A'.repeat(10_000)}`)), status: 403, says: CSRF },
  { name: 'start: duplicated csrf_token', request: async () => { const c = await atLogin(); return c.send(rawForm(`/sso/${corp.connectionId}/start`, `csrf_token=${c.csrf}&csrf_token=${c.csrf}`)); }, status: 400, says: ONCE },
  {
    name: 'start: return_to //evil.example is replaced by /dashboard',
    request: () => start(String(corp.connectionId), { return_to: '//evil.example' }),
    status: 303,
    location: 'upstream',
    makes: { signIns: 1 },
    check: async (res) => {
      const state = authorizeUrl(res).searchParams.get('state')!;
      expect(await db().selectFrom('sso_sign_ins').select('return_to').where('handle_hash', '=', sha256Hex(state)).executeTakeFirstOrThrow()).toEqual({ return_to: '/dashboard' });
    },
  },
  {
    name: 'start: a login_hint of 10 kB is not passed on',
    request: () => start(String(corp.connectionId), { login_hint: `${TEN_KB}@corp.example` }),
    status: 303,
    location: 'upstream',
    makes: { signIns: 1 },
    check: (res) => expect(authorizeUrl(res).searchParams.has('login_hint')).toBe(false),
  },

  // GET /sso/:id/oidc/callback
  { name: 'callback: no state', request: () => getWithCookie(`/sso/${corp.connectionId}/oidc/callback`), status: 400, says: BAD_LINK },
  { name: 'callback: code without state', request: () => getWithCookie(`/sso/${corp.connectionId}/oidc/callback?code=abc&iss=${encodeURIComponent(world.upstream.issuer)}`), status: 400, says: BAD_LINK },
  { name: 'callback: the error of a provider, without state', request: () => getWithCookie(`/sso/${corp.connectionId}/oidc/callback?error=access_denied`), status: 400, says: BAD_LINK },
  { name: 'callback: a state of 10 kB', request: () => getWithCookie(`/sso/${corp.connectionId}/oidc/callback?code=abc&state=${TEN_KB}`), status: 400, says: BAD_LINK },
  { name: 'callback: duplicated state', request: () => getWithCookie(`/sso/${corp.connectionId}/oidc/callback?code=abc&state=a&state=b`), status: 400, says: BAD_LINK },
  { name: 'callback: state[]=', request: () => getWithCookie(`/sso/${corp.connectionId}/oidc/callback?code=abc&state[]=a`), status: 400, says: BAD_LINK },
  { name: 'callback: an empty state', request: () => getWithCookie(`/sso/${corp.connectionId}/oidc/callback?code=abc&state=`), status: 400, says: EXPIRED },
  { name: 'callback: an unknown state', request: () => getWithCookie(`/sso/${corp.connectionId}/oidc/callback?code=abc&state=unknown-state`), status: 400, says: EXPIRED },
  { name: 'callback: no pre-session cookie', request: () => client().send({ method: 'GET', url: `/sso/${corp.connectionId}/oidc/callback?code=abc&state=unknown-state` }), status: 400, says: EXPIRED },
  { name: 'callback: a NUL in the state', request: () => getWithCookie(`/sso/${corp.connectionId}/oidc/callback?code=abc&state=a%00b`), status: 400, says: EXPIRED },
  { name: 'callback: an unknown connection id', request: () => getWithCookie('/sso/99999/oidc/callback?code=abc&state=s'), status: 400, says: EXPIRED },
  { name: 'callback: a non-numeric connection id', request: () => getWithCookie('/sso/abc/oidc/callback?code=abc&state=s'), status: 400, says: EXPIRED },
  { name: 'callback: connection id 2^31', request: () => getWithCookie('/sso/2147483648/oidc/callback?code=abc&state=s'), status: 400, says: EXPIRED },
  { name: 'callback: at the SAML connection', request: () => getWithCookie(`/sso/${samlConnectionId}/oidc/callback?code=abc&state=s`), status: 400, says: EXPIRED },

  // POST /sso/:id/saml/acs
  { name: 'acs: no body', request: () => client().send({ method: 'POST', url: `/sso/${samlConnectionId}/saml/acs` }), status: 400, says: NOT_COMPLETED },
  { name: 'acs: an empty form', request: () => acs(samlConnectionId, ''), status: 400, says: NOT_COMPLETED },
  { name: 'acs: a JSON body with a SAMLResponse that is not one', request: () => acs(samlConnectionId, JSON.stringify({ SAMLResponse: 'PHg+PC94Pg==' }), 'application/json'), status: 400, says: NOT_COMPLETED },
  { name: 'acs: a JSON body with an array SAMLResponse', request: () => acs(samlConnectionId, JSON.stringify({ SAMLResponse: ['a', 'b'] }), 'application/json'), status: 400, says: ONCE },
  { name: 'acs: a JSON body that is not JSON', request: () => acs(samlConnectionId, '{"SAMLResponse":', 'application/json'), status: 400, says: UNREADABLE },
  {
    name: 'acs: multipart/form-data',
    request: () => acs(samlConnectionId, '--b\r\nContent-Disposition: form-data; name="SAMLResponse"\r\n\r\nPHg+\r\n--b--\r\n', 'multipart/form-data; boundary=b'),
    status: 415,
    says: UNREADABLE,
  },
  { name: 'acs: text/xml (the SOAP binding, not offered)', request: () => acs(samlConnectionId, '<samlp:Response/>', 'text/xml'), status: 415, says: UNREADABLE },
  { name: 'acs: duplicated SAMLResponse', request: () => acs(samlConnectionId, 'SAMLResponse=PHg%2B&SAMLResponse=PHg%2B'), status: 400, says: ONCE },
  // Brackets mean nothing: `SAMLResponse[]` is another (unknown) field, and the SAMLResponse is missing.
  { name: 'acs: SAMLResponse[]=', request: () => acs(samlConnectionId, 'SAMLResponse[]=PHg%2B'), status: 400, says: NOT_COMPLETED },
  { name: 'acs: SAMLResponse[]= twice', request: () => acs(samlConnectionId, 'SAMLResponse[]=PHg%2B&SAMLResponse[]=PHg%2B'), status: 400, says: ONCE },
  { name: 'acs: a SAMLResponse of 1 MiB', request: () => acs(samlConnectionId, `SAMLResponse=${'A'.repeat(1024 * 1024)}`), status: 413, says: UNREADABLE },
  { name: 'acs: a SAMLResponse over the size a response may have', request: () => acs(samlConnectionId, `SAMLResponse=${'A'.repeat(Math.ceil((MAX_SAML_RESPONSE_BYTES * 4) / 3) + 100)}`), status: 400, says: NOT_COMPLETED },
  { name: 'acs: not base64', request: () => acs(samlConnectionId, `SAMLResponse=${encodeURIComponent('<samlp:Response>not base64</samlp:Response>')}`), status: 400, says: NOT_COMPLETED },
  { name: 'acs: base64 of a gzip bomb', request: () => acs(samlConnectionId, `SAMLResponse=${encodeURIComponent(gzipBomb())}`), status: 400, says: NOT_COMPLETED },
  { name: 'acs: a NUL in the SAMLResponse', request: () => acs(samlConnectionId, 'SAMLResponse=PHg%00%2B'), status: 400, says: NUL },
  { name: 'acs: at an OIDC connection', request: () => acs(corp.connectionId, 'SAMLResponse=PHg%2B'), status: 403, says: INACTIVE },
  { name: 'acs: at an unknown connection', request: () => acs(99999, 'SAMLResponse=PHg%2B'), status: 403, says: INACTIVE },
  { name: 'acs: at a non-numeric connection id', request: () => acs('abc', 'SAMLResponse=PHg%2B'), status: 403, says: INACTIVE },
  { name: 'acs: at connection id 99999999999', request: () => acs('99999999999', 'SAMLResponse=PHg%2B'), status: 403, says: INACTIVE },
  // IdP-initiated (the connection accepts them): the RelayState may only name a path of ours.
  ...(['javascript:alert(1)', '//evil.example', '/\\evil.example', 'https://evil.example/', '/\r\nSet-Cookie: x=1', `/${TEN_KB}`] as const).map(
    (relayState): Row => ({
      name: `acs: IdP-initiated with RelayState ${JSON.stringify(relayState.slice(0, 30))}${relayState.length > 30 ? ` (${relayState.length} characters)` : ''} lands on /dashboard`,
      request: () => idpInitiated(relayState),
      status: 303,
      location: '/dashboard',
      // The first of them provisions ivy@saml.example (user and link); each signs her in once.
      makes: { sessions: 1 },
    }),
  ),

  // POST /sso/finish (the confirmation of an IdP-initiated response)
  { name: 'finish: no CSRF token, a real handle', request: async () => { const { c, finishUrl } = await unsolicitedAtFinish('/dashboard'); return c.send(rawForm('/sso/finish', `handle=${encodeURIComponent(new URL(finishUrl, world.issuer).searchParams.get('handle')!)}`)); }, status: 403, says: CSRF, makes: { signIns: 1 } },
  { name: "finish: another browser's CSRF token, a real handle", request: async () => { const { finishUrl } = await unsolicitedAtFinish('/dashboard'); const other = await atLogin(); return other.send(rawForm('/sso/finish', `csrf_token=x${encodeURIComponent(other.csrf)}&handle=${encodeURIComponent(new URL(finishUrl, world.issuer).searchParams.get('handle')!)}`)); }, status: 403, says: CSRF, makes: { signIns: 1 } },
  { name: 'finish: a CSRF token, no handle', request: async () => { const c = await atLogin(); return c.send(rawForm('/sso/finish', `csrf_token=${encodeURIComponent(c.csrf)}`)); }, status: 400, says: EXPIRED },
  { name: 'finish: a CSRF token, a handle nobody has', request: async () => { const c = await atLogin(); return c.send(rawForm('/sso/finish', `csrf_token=${encodeURIComponent(c.csrf)}&handle=${'A'.repeat(43)}`)); }, status: 400, says: EXPIRED },
  { name: 'finish: a CSRF token, a handle of 10 kB', request: async () => { const c = await atLogin(); return c.send(rawForm('/sso/finish', `csrf_token=${encodeURIComponent(c.csrf)}&handle=${TEN_KB}`)); }, status: 400, says: EXPIRED },
  { name: 'finish: a CSRF token, duplicated handle', request: async () => { const c = await atLogin(); return c.send(rawForm('/sso/finish', `csrf_token=${encodeURIComponent(c.csrf)}&handle=a&handle=b`)); }, status: 400, says: ONCE },
  { name: 'finish: a JSON body', request: async () => { const c = await atLogin(); return c.send(rawForm('/sso/finish', JSON.stringify({ csrf_token: c.csrf, handle: ['a'] }), 'application/json')); }, status: 400, says: ONCE },

  // GET /sso/finish and /sso/link
  ...(['/sso/finish', '/sso/link'] as const).flatMap((path): Row[] => [
    { name: `${path}: no handle`, request: () => getWithCookie(path), status: 400, says: EXPIRED },
    { name: `${path}: an empty handle`, request: () => getWithCookie(`${path}?handle=`), status: 400, says: EXPIRED },
    { name: `${path}: a garbage handle`, request: () => getWithCookie(`${path}?handle=%FF%FE%3Cscript%3E`), status: 400, says: EXPIRED },
    { name: `${path}: a handle of 10 kB`, request: () => getWithCookie(`${path}?handle=${TEN_KB}`), status: 400, says: EXPIRED },
    { name: `${path}: a handle of 43 characters nobody has`, request: () => getWithCookie(`${path}?handle=${'A'.repeat(43)}`), status: 400, says: EXPIRED },
    { name: `${path}: duplicated handle`, request: () => getWithCookie(`${path}?handle=a&handle=b`), status: 400, says: EXPIRED },
    { name: `${path}: handle[]=`, request: () => getWithCookie(`${path}?handle[]=a`), status: 400, says: EXPIRED },
    { name: `${path}: signed in, a garbage handle`, request: () => signedIn.send({ method: 'GET', url: `${path}?handle=${'B'.repeat(43)}` }), status: 400, says: EXPIRED },
  ]),

  // POST /sso/link
  { name: 'link: no session', request: async () => (await atLogin()).send(rawForm('/sso/link', `handle=${'A'.repeat(43)}`)), status: 403, says: CSRF },
  { name: "link: no session, a pre-session's CSRF token", request: async () => { const c = await atLogin(); return c.send(rawForm('/sso/link', `handle=${'A'.repeat(43)}&csrf_token=${encodeURIComponent(c.csrf)}`)); }, status: 403, says: CSRF },
  { name: 'link: a session, no CSRF token', request: () => signedIn.send(rawForm('/sso/link', `handle=${'A'.repeat(43)}`)), status: 403, says: CSRF },
  { name: 'link: a session, a wrong CSRF token', request: () => signedIn.send(rawForm('/sso/link', `handle=${'A'.repeat(43)}&csrf_token=${'x'.repeat(43)}`)), status: 403, says: CSRF },
  { name: 'link: a session and its CSRF token, no handle', request: () => signedIn.send(rawForm('/sso/link', `csrf_token=${encodeURIComponent(sessionCsrf)}`)), status: 400, says: EXPIRED },
  { name: 'link: a session and its CSRF token, a handle of 10 kB', request: () => signedIn.send(rawForm('/sso/link', `csrf_token=${encodeURIComponent(sessionCsrf)}&handle=${TEN_KB}`)), status: 400, says: EXPIRED },
  { name: 'link: a session and its CSRF token, duplicated handle', request: () => signedIn.send(rawForm('/sso/link', `csrf_token=${encodeURIComponent(sessionCsrf)}&handle=a&handle=b`)), status: 400, says: ONCE },
  { name: 'link: a JSON body', request: () => signedIn.send(rawForm('/sso/link', JSON.stringify({ csrf_token: sessionCsrf, handle: ['a'] }), 'application/json')), status: 400, says: ONCE },

  // GET /sso/:id/saml/metadata
  { name: 'metadata: of an OIDC connection', request: () => client().send({ method: 'GET', url: `/sso/${corp.connectionId}/saml/metadata` }), status: 404, body: 'text' },
  { name: 'metadata: of an unknown connection', request: () => client().send({ method: 'GET', url: '/sso/99999/saml/metadata' }), status: 404, body: 'text' },
  { name: 'metadata: of a non-numeric id', request: () => client().send({ method: 'GET', url: '/sso/abc/saml/metadata' }), status: 404, body: 'text' },
  { name: 'metadata: of id 0', request: () => client().send({ method: 'GET', url: '/sso/0/saml/metadata' }), status: 404, body: 'text' },
  { name: 'metadata: of id 2^31', request: () => client().send({ method: 'GET', url: '/sso/2147483648/saml/metadata' }), status: 404, body: 'text' },
  { name: 'metadata: an undecodable id', request: () => client().send({ method: 'GET', url: '/sso/%E0%A4%A/saml/metadata' }), status: 400, body: 'json' },
  { name: 'metadata: an id of 150 digits', request: () => client().send({ method: 'GET', url: `/sso/${'1'.repeat(150)}/saml/metadata` }), status: 414, body: 'json' },
];

const STACK_TRACE = /\n\s+at |node_modules|\.[cm]?[jt]s:\d+:\d+|(?:Type|Reference|Syntax)Error/;

describe(`the single sign-on routes' bad-input battery of ${ROWS.length} rows on ${BACKEND} (R-7)`, () => {
  it('has at least 90 rows', () => expect(ROWS.length).toBeGreaterThanOrEqual(90));

  it.each(ROWS.map((row) => [row.name, row] as const))('%s', async (_name, row) => {
    const before = await counts();
    const started = performance.now();
    const res = await row.request();
    expect(performance.now() - started, 'answered at once').toBeLessThan(10_000);
    expect(res.statusCode, res.body.slice(0, 500)).toBe(row.status);
    expect(res.body).not.toMatch(STACK_TRACE);

    const body = row.body ?? 'html';
    if (res.statusCode === 303) {
      const location = String(res.headers.location);
      if (row.location === 'upstream') expect(new URL(location).origin).toBe(world.upstream.issuer);
      else expect(location).toBe(row.location);
    } else if (body === 'html') {
      expect(res.headers['content-type']).toBe('text/html; charset=utf-8');
      expect(res.body).toMatch(/^<!doctype html>/i);
      expect(res.headers['content-security-policy']).toContain("frame-ancestors 'none'");
      if (row.says !== undefined) expect(pageText(res.body)).toContain(row.says);
    } else if (body === 'json') {
      expect(res.headers['content-type']).toMatch(/^application\/json/);
      expect(res.json()).toEqual({ error: 'invalid_request', error_description: expect.any(String) });
    } else {
      expect(res.headers['content-type']).toBe('text/plain; charset=utf-8');
      expect(res.body).toBe('not found');
    }
    if (row.status !== 303 || row.location === 'upstream') expect(res.cookies.find((c) => c.name === 'orgauth_session' && c.value !== '')).toBeUndefined();
    await row.check?.(res);

    const after = await counts();
    const made = { sessions: 0, signIns: 0, users: 0, identities: 0, ...row.makes };
    // The first IdP-initiated row provisions its user and link; the later ones find them.
    if (row.location === '/dashboard' && after.users === before.users + 1) Object.assign(made, { users: 1, identities: 1 });
    expect({ sessions: after.sessions - before.sessions, signIns: after.signIns - before.signIns, users: after.users - before.users, identities: after.identities - before.identities }).toEqual(made);
  });
});

describe(`return_to and login_hint carried through a whole sign-in on ${BACKEND}`, () => {
  it('a sign-in started with return_to //evil.example comes back to /dashboard', async () => {
    const c = await atLogin();
    const leaving = await c.browser.post(`/sso/${corp.connectionId}/start`, { csrf_token: c.csrf, return_to: '//evil.example' });
    const back = await c.browser.get(await upstreamCallback(world, leaving, 'eve'));
    expect(back.statusCode, back.body.slice(0, 300)).toBe(303);
    expect(back.headers.location).toBe('/dashboard');
    expect(c.browser.cookies.has('orgauth_session')).toBe(true);
  });

  it('the metadata of the SAML connection is served (the rows above are refusals, not a broken route)', async () => {
    const res = await client().send({ method: 'GET', url: `/sso/${samlConnectionId}/saml/metadata` });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toBe('application/samlmetadata+xml; charset=utf-8');
    expect(res.body).toContain(`entityID="${world.issuer}/sso/${samlConnectionId}/saml/metadata"`);
  });
});
