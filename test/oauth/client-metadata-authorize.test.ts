/**
 * Client ID Metadata Documents through the authorization and token endpoints (issue 26, item 2):
 * orgauth listening on loopback, trusting a test CA through OUTBOUND_CA_FILE and allowed to fetch
 * documents from loopback through CLIENT_METADATA_ALLOW_NETWORKS, and the client's documents
 * served over https by a server on loopback with that CA's certificate. oauth4webapi is the client at the token
 * endpoint, a public one (`none`): client_id is the document's URL, PKCE proves the rest.
 *
 * The refusals are error pages (400, HTML, no Location: the client's redirect URI is not known
 * to be its own without a valid document). Each refused document would be accepted but for the
 * one thing wrong with it, so that removing that check turns the page into a redirect to sign in.
 * What the page says of a document that could not be fetched, or does not name itself, is one
 * sentence whatever answered (anyone can send any URL as a client_id).
 */
import type { FastifyInstance } from 'fastify';
import { decodeJwt } from 'jose';
import * as oauth from 'oauth4webapi';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { FETCHES_PER_MINUTE, UNUSABLE_DOCUMENT } from '../../src/oauth/models/client-metadata.js';
import { buildTestApp } from '../helpers/app.js';
import { approveConsent, signInFor } from '../helpers/consent.js';
import { createTestCertificateAuthority, type DocumentServer, startDocumentServer, type TestCertificateAuthority } from '../helpers/metadata-server.js';
import { type OidcWorld, startOidcWorld } from '../helpers/oidc-world.js';

const PASSWORD = 'metadata-client-user-1';
/** The client's callback, with a port: the consent page must show this host, port included. */
const REDIRECT = 'https://agent.example.com:8443/callback';
const REDIRECT_HOST = 'agent.example.com:8443';
const insecure = { [oauth.allowInsecureRequests]: true } as const;

let ca: TestCertificateAuthority;
let documents: DocumentServer;
let world: OidcWorld;
let as: oauth.AuthorizationServer;
let user: { email: string };
/** The user is a member of the world's organization and owns this one: a choice to make. */
let chosenOrganizationId: number;

beforeAll(async () => {
  ca = createTestCertificateAuthority('orgauth authorize test CA');
  documents = await startDocumentServer(ca.server);
  world = await startOidcWorld({ OUTBOUND_CA_FILE: ca.caFile, CLIENT_METADATA_ALLOW_NETWORKS: '127.0.0.0/8' });
  const db = world.t.handle.db;
  const created = await createUser(db, { email: `cimd-${process.pid}-${Date.now()}@example.com`, password: PASSWORD, name: 'Ada Agent-User' });
  user = { email: created.email };
  await addMember(db, { organizationId: world.org.organizationId, userId: created.id, role: 'member' });
  chosenOrganizationId = (await createOrganization(db, { name: 'Chosen Org', ownerUserId: created.id })).id;
  as = await oauth.processDiscoveryResponse(new URL(world.issuer), await oauth.discoveryRequest(new URL(world.issuer), { algorithm: 'oauth2', ...insecure }));
}, 60_000);

afterAll(async () => {
  await world?.close();
  await documents?.close();
  ca?.remove();
});

let n = 0;
/** A document path no other test uses: no cache entry or row is shared between tests. */
const path = (label: string) => `/agents/${label}-${++n}.json`;
const valid = (url: string, extra: Record<string, unknown> = {}) => ({
  client_id: url,
  client_name: 'Research Agent',
  redirect_uris: [REDIRECT],
  token_endpoint_auth_method: 'none',
  ...extra,
});
const rowOf = (clientId: string) => world.t.handle.db.selectFrom('applications').selectAll().where('client_id', '=', clientId).executeTakeFirst();

/** An authorization request as a public client makes it: PKCE S256, a state, the data scope it wants. */
async function authorizationRequest(clientId: string, redirectUri = REDIRECT) {
  const verifier = oauth.generateRandomCodeVerifier();
  const state = oauth.generateRandomState();
  const url = new URL('/oauth/authorize', world.issuer);
  for (const [k, v] of Object.entries({
    client_id: clientId,
    redirect_uri: redirectUri,
    response_type: 'code',
    scope: 'contacts.read',
    state,
    code_challenge: await oauth.calculatePKCECodeChallenge(verifier),
    code_challenge_method: 'S256',
  })) {
    url.searchParams.set(k, v);
  }
  return { url, verifier, state };
}

/** Redeems the code on `callback` at /oauth/token as oauth4webapi does for a `none` client; also returns the request it sent. */
async function redeem(clientId: string, callback: URL, state: string, verifier: string) {
  const client: oauth.Client = { client_id: clientId, token_endpoint_auth_method: 'none' };
  const sent: { body: URLSearchParams; authorization: string | null }[] = [];
  const params = oauth.validateAuthResponse(as, client, callback, state);
  const response = await oauth.authorizationCodeGrantRequest(as, client, oauth.None(), params, REDIRECT, verifier, {
    ...insecure,
    [oauth.customFetch]: async (url, init) => {
      sent.push({ body: new URLSearchParams(String(init.body)), authorization: new Headers(init.headers).get('authorization') });
      return fetch(url, init);
    },
  });
  return { tokens: await oauth.processAuthorizationCodeResponse(as, client, response), sent };
}

/** The message of an error page. */
const errorMessage = (body: string) => /<p class="error">([\s\S]*?)<\/p>/.exec(body)?.[1];
const UNUSABLE = UNUSABLE_DOCUMENT.replace("'", '&#39;');

/** AZ-2: the request ends on an error page of orgauth's: 400, HTML, nothing sent to the client's redirect URI. */
async function expectErrorPage(res: Response, description: RegExp | string): Promise<void> {
  const body = await res.text();
  expect(res.status, body).toBe(400);
  expect(res.headers.get('location')).toBeNull();
  expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
  expect(body).toContain('<p class="error">');
  if (typeof description === 'string') expect(errorMessage(body)).toBe(description);
  else expect(body).toMatch(description);
  expect(body).not.toContain(REDIRECT);
}

/** GET /oauth/authorize as a browser sends it, redirects not followed. */
const authorize = (url: URL) => fetch(url, { redirect: 'manual' });

describe('a client identified by its metadata document URL', () => {
  it('authorizes: sign-in, a consent page saying nobody verified it (AG-3), the organization chosen, a token for that organization', async () => {
    const url = documents.json(path('agent'), (u) => valid(u));
    const { url: authorizationUrl, verifier, state } = await authorizationRequest(url);

    const { browser, page } = await signInFor(authorizationUrl, { issuer: world.issuer, email: user.email, password: PASSWORD });
    const consent = await page.text();
    expect(page.status, consent).toBe(200);
    expect(consent).toContain('<h1>Authorize Research Agent</h1>');
    // The notice: nobody verified this client; who it really is (its URL) and where it sends the user (the host).
    const notice = /<div class="warning unverified" role="note">([\s\S]*?)<\/div>/.exec(consent)?.[1];
    expect(notice, consent).toBeDefined();
    expect(notice).toContain('Nobody has verified this application.');
    expect(notice).toContain(`<code>${REDIRECT_HOST}</code>`);
    expect(notice).toContain(`<code>${url}</code>`);
    // The organization choice: both of the user's organizations, neither chosen for them.
    for (const id of [world.org.organizationId, chosenOrganizationId]) expect(consent).toMatch(new RegExp(`name="organization_id" value="${id}" required>`));

    const callback = await approveConsent(browser, world.issuer, consent, chosenOrganizationId);
    expect(`${callback.origin}${callback.pathname}`).toBe(REDIRECT);
    expect(callback.searchParams.get('iss')).toBe(world.issuer);

    const { tokens, sent } = await redeem(url, callback, state, verifier);
    // A public client: client_id is the URL, the code_verifier proves the request was its own, no secret anywhere.
    expect(sent).toHaveLength(1);
    expect(sent[0]!.authorization).toBeNull();
    expect(sent[0]!.body.get('client_id')).toBe(url);
    expect(sent[0]!.body.get('code_verifier')).toBe(verifier);
    expect(sent[0]!.body.has('client_secret')).toBe(false);

    expect(tokens.organization_id).toBe(chosenOrganizationId);
    expect(tokens.organization_name).toBe('Chosen Org');
    expect(tokens.scope).toBe('contacts.read');
    expect(decodeJwt(tokens.access_token)).toMatchObject({ client_id: url, organization_id: chosenOrganizationId, scope: 'contacts.read' });
    expect(await rowOf(url)).toMatchObject({ registration: 'metadata_document', organization_id: null, token_endpoint_auth_method: 'none', client_secret_hash: null });
  });

  it('is not fetched again by a second authorization within its cache lifetime', async () => {
    const cachedPath = path('cached');
    const url = documents.json(cachedPath, (u) => valid(u), { 'cache-control': 'public, max-age=600' });
    const first = await authorizationRequest(url);
    const { browser, page } = await signInFor(first.url, { issuer: world.issuer, email: user.email, password: PASSWORD });
    const callback = await approveConsent(browser, world.issuer, await page.text(), chosenOrganizationId);
    expect((await redeem(url, callback, first.state, first.verifier)).tokens.organization_id).toBe(chosenOrganizationId);
    // Asked for at the first GET; the GET after sign-in and the consent POST used the cache.
    expect(documents.hits(cachedPath)).toBe(1);

    // The second authorization: the consent given is remembered, so a code comes back at once.
    const second = await authorizationRequest(url);
    const res = await browser.fetch({ url: world.issuer }, second.url.href);
    expect(res.status).toBe(303);
    const again = new URL(res.headers.get('location')!);
    expect(again.searchParams.get('state')).toBe(second.state);
    expect((await redeem(url, again, second.state, second.verifier)).tokens.organization_id).toBe(chosenOrganizationId);
    expect(documents.hits(cachedPath)).toBe(1);
  });

  it('whose response forbids caching is still used for a minute: one fetch for the GET, the GET after sign-in and the consent POST', async () => {
    const uncachedPath = path('uncached');
    const url = documents.json(uncachedPath, (u) => valid(u), { 'cache-control': 'no-store' });
    const { url: authorizationUrl } = await authorizationRequest(url);
    const { browser, page } = await signInFor(authorizationUrl, { issuer: world.issuer, email: user.email, password: PASSWORD });
    const callback = await approveConsent(browser, world.issuer, await page.text(), chosenOrganizationId);
    expect(`${callback.origin}${callback.pathname}`).toBe(REDIRECT);
    expect(documents.hits(uncachedPath)).toBe(1);
  });
});

describe('refused at /oauth/authorize with an error page (AZ-2)', () => {
  it('a document whose client_id is not its URL', async () => {
    const docPath = path('mismatch');
    const url = documents.json(docPath, (u) => valid(u, { client_id: `${documents.origin}/agents/someone-else.json` }));
    // Said in the log only: an answer from some server that is not a client's document is not described.
    await expectErrorPage(await authorize((await authorizationRequest(url)).url), UNUSABLE);
    expect(documents.hits(docPath)).toBe(1);
    expect(await rowOf(url)).toBeUndefined();
  });

  it('a document that does not list the request’s redirect_uri', async () => {
    const url = documents.json(path('other-redirect'), (u) => valid(u, { redirect_uris: ['https://agent.example.com:8443/other-callback'] }));
    await expectErrorPage(await authorize((await authorizationRequest(url)).url), /redirect_uri is not registered for this application/);
    // The redirect URI it does list works: the refusal was for the one it does not.
    const listed = await authorize((await authorizationRequest(url, 'https://agent.example.com:8443/other-callback')).url);
    expect(listed.status).toBe(303);
    expect(listed.headers.get('location')).toMatch(/^\/login\?return_to=/);
  });

  it('a document over 5 KB, while one of exactly 5 KB is accepted (AG-1)', async () => {
    const padded = (u: string, size: number) => {
      const base = JSON.stringify(valid(u, { padding: '' }));
      return JSON.stringify(valid(u, { padding: 'x'.repeat(size - base.length) }));
    };
    const serve = (label: string, size: number) =>
      documents.route(path(label), (req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(padded(`${documents.origin}${req.url}`, size)));
    const big = serve('big', 5 * 1024 + 1);
    await expectErrorPage(await authorize((await authorizationRequest(big)).url), UNUSABLE);
    expect(await rowOf(big)).toBeUndefined();

    const exact = await authorize((await authorizationRequest(serve('exact', 5 * 1024))).url);
    expect(exact.status).toBe(303);
    expect(exact.headers.get('location')).toMatch(/^\/login\?return_to=/);
  });

  it('a redirect, not followed, though it leads to a document naming the first URL and carries one (AG-1)', async () => {
    const target = path('target');
    const redirectPath = path('redirect');
    // Were the redirect followed, this document would pass: its client_id is the URL asked for.
    documents.json(target, () => valid(`${documents.origin}${redirectPath}`));
    const url = documents.route(redirectPath, (req, res) =>
      res.writeHead(302, { location: `${documents.origin}${target}`, 'content-type': 'application/json' }).end(JSON.stringify(valid(`${documents.origin}${req.url}`))),
    );
    await expectErrorPage(await authorize((await authorizationRequest(url)).url), UNUSABLE);
    expect(documents.hits(redirectPath)).toBe(1);
    expect(documents.hits(target)).toBe(0);
    expect(await rowOf(url)).toBeUndefined();
  });

  it('a document on a private address (loopback) when CLIENT_METADATA_ALLOW_NETWORKS does not allow it, before connecting, whatever OUTBOUND_ALLOW_NETWORKS allows (AG-1)', async () => {
    // The same database and CA, without the setting: what a production instance runs with, here
    // one whose SSO upstreams on the company network (loopback standing in for it) are allowed.
    const strict: FastifyInstance = await buildTestApp(world.t.handle.db, { env: { OUTBOUND_CA_FILE: ca.caFile, OUTBOUND_ALLOW_NETWORKS: '127.0.0.0/8' } });
    try {
      const url = documents.json(path('private'), (u) => valid(u));
      const { url: authorizationUrl } = await authorizationRequest(url);
      const connections = documents.connections();
      const res = await strict.inject({ method: 'GET', url: `${authorizationUrl.pathname}${authorizationUrl.search}` });
      expect(res.statusCode, res.body).toBe(400);
      expect(res.headers.location).toBeUndefined();
      expect(res.headers['content-type']).toBe('text/html; charset=utf-8');
      expect(errorMessage(res.body)).toBe(UNUSABLE);
      expect(documents.connections()).toBe(connections);
      expect(await rowOf(url)).toBeUndefined();

      // The instance with the setting fetches the very same document.
      const allowed = await authorize(authorizationUrl);
      expect(allowed.status).toBe(303);
      expect(allowed.headers.get('location')).toMatch(/^\/login\?return_to=/);
    } finally {
      await strict.close();
    }
  });

  it('the same page whatever answered at the URL: 403, 404, an HTML page, JSON that is not a client’s document, a closed port', async () => {
    const forbidden = documents.route(path('forbidden'), (_req, res) => res.writeHead(403, { 'content-type': 'text/html' }).end('<h1>Forbidden</h1>'));
    const html = documents.route(path('html'), (_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html>admin console</html>'));
    const json = documents.route(path('internal-api'), (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"status":"ok","version":"1.2.3"}'));
    const missing = `${documents.origin}${path('missing')}`;
    // Nothing listens on port 1 of loopback.
    const closed = 'https://127.0.0.1:1/client.json';
    const pages = new Set<string | undefined>();
    for (const url of [forbidden, missing, html, json, closed]) {
      const res = await authorize((await authorizationRequest(url)).url);
      const body = await res.text();
      expect(res.status, url).toBe(400);
      expect(res.headers.get('location')).toBeNull();
      pages.add(errorMessage(body));
      expect(await rowOf(url)).toBeUndefined();
    }
    expect([...pages]).toEqual([UNUSABLE]);
    expect(documents.hits(new URL(forbidden).pathname)).toBe(1);
    expect(documents.hits(new URL(missing).pathname)).toBe(1);
  });

  it(`more than ${FETCHES_PER_MINUTE} documents not in the cache from one address within a minute: a 429 page, and no fetch`, async () => {
    const from = (url: string, remoteAddress: string) =>
      authorizationRequest(url).then(({ url: authorizationUrl }) => world.app.inject({ method: 'GET', url: `${authorizationUrl.pathname}${authorizationUrl.search}`, remoteAddress }));
    for (let i = 0; i < FETCHES_PER_MINUTE; i++) {
      const res = await from(documents.json(path('flood'), (u) => valid(u)), '198.51.100.77');
      expect(res.statusCode, res.body).toBe(303);
    }
    const last = documents.json(path('flood'), (u) => valid(u));
    const refused = await from(last, '198.51.100.77');
    expect(refused.statusCode).toBe(429);
    expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
    expect(refused.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(refused.headers.location).toBeUndefined();
    expect(documents.hits(new URL(last).pathname)).toBe(0);
    expect(await rowOf(last)).toBeUndefined();
    // Another address is not held back.
    expect((await from(last, '198.51.100.78')).statusCode).toBe(303);
  });
});
