/**
 * Client ID Metadata Documents (draft-ietf-oauth-client-id-metadata-document) against real https
 * servers on loopback, with certificates from a test CA that OUTBOUND_CA_FILE names, loopback
 * allowed by CLIENT_METADATA_ALLOW_NETWORKS, and the test database: no mocks. A refusal that
 * must happen before any connection is shown by the server never seeing one; each document that
 * is refused would be accepted but for the one thing wrong with it (a 302 or a 404 carries a
 * valid document, a text/plain one is valid JSON). Time is the instance's clock, moved forward
 * by the tests (`later`), not waited for.
 */
import { writeFileSync } from 'node:fs';
import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config.js';
import type { Application } from '../../src/db/schema.js';
import { createLogger } from '../../src/logger.js';
import { createOutboundFetch } from '../../src/lib/outbound.js';
import { clientAuthThrottle, authenticateClient } from '../../src/oauth/helpers/client-auth.js';
import { DATA_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { ApplicationCache } from '../../src/oauth/models/application-cache.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import {
  ClientMetadataDocuments,
  ClientMetadataError,
  DEFAULT_FRESHNESS_S,
  FETCHES_PER_MINUTE,
  freshnessSeconds,
  MAX_FRESHNESS_S,
  MIN_FRESHNESS_S,
  UNUSABLE_DOCUMENT,
} from '../../src/oauth/models/client-metadata.js';
import { TooManyAttemptsError } from '../../src/oauth/errors.js';
import { AppError } from '../../src/errors.js';
import { buildTestApp, TEST_SECRET_KEY, testConfig } from '../helpers/app.js';
import { createTestDatabase } from '../helpers/db.js';
import { createTestCertificateAuthority, type DocumentServer, startDocumentServer, type TestCertificateAuthority } from '../helpers/metadata-server.js';
import { createOrgFixture, form } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let ca: TestCertificateAuthority;
let rogue: TestCertificateAuthority;
let server: DocumentServer;
let rogueServer: DocumentServer;
/** Trusts the test CA and may reach loopback: what a developer's or the test suite's instance runs with. */
let documents: ClientMetadataDocuments;
let env: Record<string, string>;
/** How far the instances' clock has been moved forward (`later`), in milliseconds. */
let skew = 0;
const now = () => performance.now() + skew;
/** Moves the clock of `documents` (and of every instance made with `now`) forward. */
const later = (seconds: number) => {
  skew += seconds * 1000;
};

const REDIRECT = 'https://agent.example.com/callback';
const logger = createLogger({ logLevel: 'silent' });

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  ca = createTestCertificateAuthority('orgauth test CA');
  rogue = createTestCertificateAuthority('some other CA');
  server = await startDocumentServer(ca.server);
  rogueServer = await startDocumentServer(rogue.server);
  env = { OUTBOUND_CA_FILE: ca.caFile, CLIENT_METADATA_ALLOW_NETWORKS: '127.0.0.0/8' };
  documents = new ClientMetadataDocuments(t.handle.db, testConfig(env), logger, { now });
});
afterAll(async () => {
  await server?.close();
  await rogueServer?.close();
  ca?.remove();
  rogue?.remove();
  await t?.close();
});

let n = 0;
/** A path no other test uses, so that no cache entry or row is shared between tests. */
const path = (label: string) => `/clients/${label}-${++n}.json`;
const valid = (url: string, extra: Record<string, unknown> = {}) => ({ client_id: url, client_name: 'Research Agent', redirect_uris: [REDIRECT], ...extra });

/**
 * Each resolve comes from an address of its own, so that the per-address fetch limit counts only
 * the test that is about it.
 */
let lastAddress = 0;
const from = () => {
  const n = ++lastAddress;
  return { ip: `10.${(n >> 16) & 0xff}.${(n >> 8) & 0xff}.${n & 0xff}` };
};

const failure = (promise: Promise<unknown>): Promise<unknown> =>
  promise.then(
    () => undefined,
    (e: unknown) => e,
  );

/** A refusal the error page explains: a problem with the URL, or with a document that names itself. */
async function refusal(promise: Promise<unknown>, reason: RegExp): Promise<ClientMetadataError> {
  const error = await failure(promise);
  expect(error).toBeInstanceOf(ClientMetadataError);
  const refused = error as ClientMetadataError;
  expect(refused.statusCode).toBe(400);
  expect(refused.reason).toMatch(reason);
  expect(refused.description).toBe(`The application's client metadata document cannot be used: ${refused.reason}.`);
  return refused;
}

/** A refusal whose page says only UNUSABLE_DOCUMENT: what answered at the URL is for the log. */
async function hiddenRefusal(promise: Promise<unknown>, reason: RegExp): Promise<ClientMetadataError> {
  const error = await failure(promise);
  expect(error).toBeInstanceOf(ClientMetadataError);
  const refused = error as ClientMetadataError;
  expect(refused.statusCode).toBe(400);
  expect(refused.reason).toMatch(reason);
  expect(refused.description).toBe(UNUSABLE_DOCUMENT);
  return refused;
}

const rowOf = (clientId: string) => t.handle.db.selectFrom('applications').selectAll().where('client_id', '=', clientId).executeTakeFirst();

describe('a valid document', () => {
  it('becomes a public client of no organization, and a changed document updates that row', async () => {
    let document: Record<string, unknown> = {};
    const url = server.route(path('good'), (_req, res) => res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' }).end(JSON.stringify(document)));
    document = valid(url, { redirect_uris: [REDIRECT, 'http://127.0.0.1/callback'], logo_uri: 'https://agent.example.com/logo.png', unknown_field: { nested: true } });

    const first = await documents.resolve(url, from());
    expect(first).toMatchObject({
      client_id: url,
      registration: 'metadata_document',
      organization_id: null,
      type: 'public',
      token_endpoint_auth_method: 'none',
      client_secret_hash: null,
      require_pkce: true,
      disabled: false,
      name: 'Research Agent',
      redirect_uris: [REDIRECT, 'http://127.0.0.1/callback'],
      scopes: [...DATA_SCOPES],
      grant_types: ['authorization_code', 'refresh_token'],
      post_logout_redirect_uris: [],
    });
    expect(first.metadata_fetched_at).toBeInstanceOf(Date);
    expect(await rowOf(url)).toEqual(first);

    // Fetched again a minute on (no-store: the shortest freshness), unchanged: the same row, its fetch time moved, updated_at not.
    await new Promise((r) => setTimeout(r, 20));
    later(MIN_FRESHNESS_S);
    const same = await documents.resolve(url, from());
    expect(same.id).toBe(first.id);
    expect(same.updated_at).toEqual(first.updated_at);
    expect(same.metadata_fetched_at!.getTime()).toBeGreaterThan(first.metadata_fetched_at!.getTime());

    document = valid(url, { client_name: 'Research Agent 2', redirect_uris: ['https://agent.example.com/v2/callback'], grant_types: ['authorization_code'], scope: 'openid contacts.read' });
    later(MIN_FRESHNESS_S);
    const changed = await documents.resolve(url, from());
    expect(changed).toMatchObject({ id: first.id, name: 'Research Agent 2', redirect_uris: ['https://agent.example.com/v2/callback'], grant_types: ['authorization_code'], scopes: ['contacts.read'] });
    expect(changed.updated_at.getTime()).toBeGreaterThan(first.updated_at.getTime());
    expect(await rowOf(url)).toEqual(changed);
    expect(server.hits(new URL(url).pathname)).toBe(3);
  });

  it('without client_name is named after its first redirect URI’s host; a scope naming no data scope keeps the data scopes', async () => {
    const url = server.json(path('unnamed'), (u) => ({ client_id: u, redirect_uris: ['https://callback.agent.example:8443/cb', REDIRECT], scope: 'openid profile' }));
    expect(await documents.resolve(url, from())).toMatchObject({ name: 'callback.agent.example:8443', scopes: [...DATA_SCOPES] });
  });

  it('is accepted as application/json with parameters, or as an application/…+json type', async () => {
    for (const type of ['application/json; charset=utf-8', 'Application/JSON', 'application/oauth-client+json']) {
      const url = server.json(path('typed'), (u) => valid(u), { 'content-type': type });
      expect((await documents.resolve(url, from())).client_id).toBe(url);
    }
  });

  it('is found by the token endpoint as a client authenticating with `none`', async () => {
    const url = server.json(path('token'), (u) => valid(u));
    const application = await documents.resolve(url, from());
    const cache = new ApplicationCache(t.handle.db);
    const authenticated = await authenticateClient(cache.find, clientAuthThrottle(), { authorization: undefined, query: {}, body: { client_id: url }, ip: '127.0.0.1' });
    expect(authenticated).toMatchObject({ method: 'none', application: { id: application.id } });

    // Through the real endpoint: past client authentication (so invalid_grant for a made-up
    // code), while a metadata URL never resolved is an unknown client.
    const app: FastifyInstance = await buildTestApp(t.handle.db, { env });
    try {
      const redeem = (clientId: string) =>
        app.inject({
          method: 'POST',
          url: '/oauth/token',
          headers: { 'content-type': 'application/x-www-form-urlencoded' },
          payload: form({ grant_type: 'authorization_code', client_id: clientId, code: 'made-up-code-0123456789', redirect_uri: REDIRECT, code_verifier: 'v'.repeat(43) }),
        });
      const known = await redeem(url);
      expect(known.statusCode).toBe(400);
      expect(known.json().error).toBe('invalid_grant');
      const unknown = await redeem(`${server.origin}/never-resolved.json`);
      expect(unknown.statusCode).toBe(401);
      expect(unknown.json().error).toBe('invalid_client');
    } finally {
      await app.close();
    }
  });
});

describe('refused documents', () => {
  it('whose client_id is not exactly the URL', async () => {
    for (const clientId of [(u: string) => `${u}/`, (u: string) => u.replace('https://127.0.0.1', 'https://localhost'), (u: string) => `${u}?x=1`, () => undefined, (u: string) => [u]]) {
      const url = server.json(path('mismatch'), (u) => valid(u, { client_id: clientId(u) }));
      await hiddenRefusal(documents.resolve(url, from()), /client_id is not exactly the URL/);
      expect(await rowOf(url)).toBeUndefined();
    }
  });

  it('larger than 5 KB, whether declared or not; 5 KB exactly is accepted', async () => {
    const padded = (u: string, size: number) => {
      const base = JSON.stringify(valid(u, { padding: '' }));
      return JSON.stringify(valid(u, { padding: 'x'.repeat(size - base.length) }));
    };
    const exact = server.route(path('exact'), (req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(padded(`${server.origin}${req.url}`, 5120)));
    expect((await documents.resolve(exact, from())).client_id).toBe(exact);

    const declared = server.route(path('big'), (req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(padded(`${server.origin}${req.url}`, 5121)));
    await hiddenRefusal(documents.resolve(declared, from()), /larger than 5 KB/);
    const chunked = server.route(path('chunked'), (req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      const body = padded(`${server.origin}${req.url}`, 6000);
      res.write(body.slice(0, 3000));
      res.end(body.slice(3000));
    });
    await hiddenRefusal(documents.resolve(chunked, from()), /larger than 5 KB/);
    expect(await rowOf(declared)).toBeUndefined();
  });

  it('behind a redirect, which is not followed (even with a valid document in its body)', async () => {
    const target = server.json(path('target'), (u) => valid(u));
    const url = server.route(path('redirect'), (req, res) =>
      res.writeHead(302, { location: target, 'content-type': 'application/json' }).end(JSON.stringify(valid(`${server.origin}${req.url}`))),
    );
    await hiddenRefusal(documents.resolve(url, from()), /redirect/);
    expect(server.hits(new URL(target).pathname)).toBe(0);
    expect(await rowOf(url)).toBeUndefined();
  });

  it.each([203, 404, 500])('answered with status %i (with a valid document in its body)', async (status) => {
    const url = server.route(path(`status-${status}`), (req, res) =>
      res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(valid(`${server.origin}${req.url}`))),
    );
    await hiddenRefusal(documents.resolve(url, from()), new RegExp(`HTTP status ${status}, not 200`));
  });

  it.each(['text/plain', 'text/html', 'application/jsonp', 'application/x-www-form-urlencoded', ''])('served as %j (valid JSON nonetheless)', async (type) => {
    const url = server.route(path('type'), (req, res) => {
      res.writeHead(200, type === '' ? {} : { 'content-type': type });
      res.end(JSON.stringify(valid(`${server.origin}${req.url}`)));
    });
    await hiddenRefusal(documents.resolve(url, from()), /not served as application\/json/);
  });

  it.each([
    ['a client_secret', { client_secret: 'shh' }],
    ['a client_secret_expires_at', { client_secret_expires_at: 0 }],
    ['a null client_secret', { client_secret: null }],
    ['client_secret_basic', { token_endpoint_auth_method: 'client_secret_basic' }],
    ['client_secret_post', { token_endpoint_auth_method: 'client_secret_post' }],
    ['client_secret_jwt', { token_endpoint_auth_method: 'client_secret_jwt' }],
    ['private_key_jwt', { token_endpoint_auth_method: 'private_key_jwt', jwks_uri: 'https://agent.example.com/jwks' }],
  ])('with %s', async (_label, extra) => {
    const url = server.json(path('secret'), (u) => valid(u, extra));
    await refusal(documents.resolve(url, from()), /client secret|token_endpoint_auth_method must be none/);
    expect(await rowOf(url)).toBeUndefined();
    // The same document without it is fine: the refusal was for the secret.
    const plain = server.json(path('no-secret'), (u) => valid(u, { token_endpoint_auth_method: 'none' }));
    expect((await documents.resolve(plain, from())).token_endpoint_auth_method).toBe('none');
  });

  it.each([
    ['no redirect_uris', { redirect_uris: undefined }, /no redirect_uris/],
    ['empty redirect_uris', { redirect_uris: [] }, /no redirect_uris/],
    ['a redirect_uris string', { redirect_uris: REDIRECT }, /no redirect_uris/],
    ['a non-string redirect URI', { redirect_uris: [REDIRECT, 7] }, /not all strings/],
    ['an http redirect URI off loopback', { redirect_uris: ['http://agent.example.com/cb'] }, /http is allowed only for loopback/],
    ['a redirect URI with a fragment', { redirect_uris: ['https://agent.example.com/cb#x'] }, /fragment/],
    ['a javascript: redirect URI', { redirect_uris: ['javascript:alert(1)'] }, /https/],
    ['21 redirect URIs', { redirect_uris: Array.from({ length: 21 }, (_, i) => `https://agent.example.com/cb${i}`) }, /more than 20/],
    ['client_credentials', { grant_types: ['authorization_code', 'client_credentials'] }, /grant_types may hold only/],
    ['the device grant', { grant_types: ['urn:ietf:params:oauth:grant-type:device_code'] }, /grant_types may hold only/],
    ['grant_types without authorization_code', { grant_types: ['refresh_token'] }, /must include authorization_code/],
    ['response_types without code', { response_types: ['token'] }, /response_types must include code/],
    ['a non-string scope', { scope: ['contacts.read'] }, /scope is not a string/],
    ['a non-string client_name', { client_name: 12 }, /client_name is not a string/],
    ['an empty client_name', { client_name: '  ' }, /client_name is empty/],
    ['a client_name over 200 characters', { client_name: 'a'.repeat(201) }, /longer than 200/],
    ['a control character in client_name', { client_name: 'Agent\u0007' }, /control or direction-changing/],
    ['a newline in client_name', { client_name: 'Agent\nOfficial' }, /control or direction-changing/],
    ['a right-to-left override in client_name', { client_name: 'Agent \u202Etxt.exe' }, /control or direction-changing/],
  ])('with %s', async (_label, extra, description) => {
    const url = server.json(path('shape'), (u) => valid(u, extra));
    await refusal(documents.resolve(url, from()), description);
    expect(await rowOf(url)).toBeUndefined();
  });

  it.each([
    ['invalid JSON', '{"client_id": ', /not valid JSON/],
    ['a JSON array', '[]', /not a JSON object/],
    ['a JSON string', '"https://agent.example.com"', /not a JSON object/],
    ['JSON null', 'null', /not a JSON object/],
  ])('that is %s', async (_label, body, description) => {
    const url = server.route(path('body'), (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(body));
    await hiddenRefusal(documents.resolve(url, from()), description);
  });

  it('when the client_id URL names an application registered otherwise, which is left alone', async () => {
    const url = server.json(path('taken'), (u) => valid(u, { client_name: 'Impostor' }));
    const fixture = await createOrgFixture(t.handle.db);
    const developer = await createApplication(t.handle.db, { organizationId: fixture.organizationId, type: 'public', name: 'Developer app', redirectUris: ['https://dev.example.com/cb'] });
    await t.handle.db.updateTable('applications').set({ client_id: url }).where('client_id', '=', developer.client_id).execute();
    const before = await rowOf(url);
    await refusal(documents.resolve(url, from()), /already the client_id of an application registered otherwise/);
    expect(await rowOf(url)).toEqual(before);
    expect(before).toMatchObject({ registration: 'developer', name: 'Developer app', organization_id: fixture.organizationId });
  });
});

describe('where the document may be fetched from', () => {
  it('refuses a loopback address without CLIENT_METADATA_ALLOW_NETWORKS, before connecting, whatever OUTBOUND_ALLOW_NETWORKS allows', async () => {
    // OUTBOUND_ALLOW_NETWORKS opens loopback to the upstreams an administrator configured, not to URLs anyone sends.
    const strictEnvs: Record<string, string>[] = [{ OUTBOUND_CA_FILE: ca.caFile }, { OUTBOUND_CA_FILE: ca.caFile, OUTBOUND_ALLOW_NETWORKS: '127.0.0.0/8' }];
    for (const strictEnv of strictEnvs) {
      const strict = new ClientMetadataDocuments(t.handle.db, testConfig(strictEnv), logger);
      const url = server.json(path('private'), (u) => valid(u));
      const connections = server.connections();
      await hiddenRefusal(strict.resolve(url, from()), /address this server may not fetch from/);
      expect(server.connections()).toBe(connections);
      expect(await rowOf(url)).toBeUndefined();
    }
    const url = server.json(path('private'), (u) => valid(u));
    // The same document, with the setting: accepted.
    expect((await documents.resolve(url, from())).client_id).toBe(url);
  });

  it('refuses a certificate from a CA it does not trust, and trusts the test CA only through OUTBOUND_CA_FILE', async () => {
    const rogueUrl = rogueServer.json(path('rogue'), (u) => valid(u));
    await hiddenRefusal(documents.resolve(rogueUrl, from()), /TLS certificate is not trusted/);
    expect(rogueServer.hits(new URL(rogueUrl).pathname)).toBe(0);

    const url = server.json(path('ca'), (u) => valid(u));
    const withoutCa = new ClientMetadataDocuments(t.handle.db, testConfig({ CLIENT_METADATA_ALLOW_NETWORKS: '127.0.0.0/8' }), logger);
    await hiddenRefusal(withoutCa.resolve(url, from()), /TLS certificate is not trusted/);
    expect(server.hits(new URL(url).pathname)).toBe(0);
    expect((await documents.resolve(url, from())).client_id).toBe(url);
  });

  it('refuses http, even in development where other outbound requests may use it', async () => {
    expect(testConfig(env).outbound.allowHttp).toBe(true);
    let connections = 0;
    const plain = http.createServer((req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(valid(`http://127.0.0.1:${(plain.address() as AddressInfo).port}${req.url}`))));
    plain.on('connection', () => connections++);
    plain.listen(0, '127.0.0.1');
    await once(plain, 'listening');
    try {
      const url = `http://127.0.0.1:${(plain.address() as AddressInfo).port}/client.json`;
      await refusal(documents.resolve(url, from()), /must use https/);
      expect(connections).toBe(0);
    } finally {
      plain.closeAllConnections();
      plain.close();
    }
  });

  it.each([
    ['a fragment', (o: string) => `${o}/client.json#frag`, /fragment/],
    ['no path', (o: string) => o, /must have a path/],
    ['only a slash for a path', (o: string) => `${o}/`, /must have a path/],
    ['user info', (o: string) => o.replace('https://', 'https://user:pw@') + '/client.json', /user name or password/],
    ['a dot segment', (o: string) => `${o}/a/../client.json`, /normal form/],
    ['an encoded dot segment', (o: string) => `${o}/a/%2e%2e/client.json`, /normal form/],
    ['an upper-case host', (o: string) => `${o.replace('https://', 'HTTPS://')}/client.json`, /normal form/],
    ['a backslash', (o: string) => `${o}\\client.json`, /normal form/],
    ['not a URL', () => 'https://', /not a URL/],
    ['over 2000 characters', (o: string) => `${o}/${'a'.repeat(2000)}`, /longer than 2000/],
  ])('refuses a client_id with %s, before connecting', async (_label, clientId, description) => {
    const connections = server.connections();
    await refusal(documents.resolve(clientId(server.origin), from()), description);
    expect(server.connections()).toBe(connections);
  });

  it('gives up on a server that does not answer within 5 seconds', async () => {
    const url = server.route(path('silent'), () => undefined);
    const started = performance.now();
    await hiddenRefusal(documents.resolve(url, from()), /did not arrive within 5 seconds/);
    const elapsed = performance.now() - started;
    expect(elapsed).toBeGreaterThanOrEqual(4900);
    expect(elapsed).toBeLessThan(7000);
  }, 15_000);
});

describe('caching', () => {
  it('does not fetch again within max-age', async () => {
    const url = server.json(path('max-age'), (u) => valid(u), { 'cache-control': 'public, max-age=3600' });
    const first = await documents.resolve(url, from());
    const second = await documents.resolve(url, from());
    expect(second.id).toBe(first.id);
    expect(server.hits(new URL(url).pathname)).toBe(1);
  });

  it('does not fetch again for the default 5 minutes when the response says nothing', async () => {
    const url = server.json(path('default'), (u) => valid(u));
    await documents.resolve(url, from());
    await documents.resolve(url, from());
    expect(server.hits(new URL(url).pathname)).toBe(1);
  });

  it.each([['no-store'], ['no-cache'], ['private, max-age=3600'], ['max-age=0'], ['max-age=10']])(
    'uses a document whose response says %s for a minute all the same, then fetches it again',
    async (cacheControl) => {
      const url = server.json(path('no-store'), (u) => valid(u), { 'cache-control': cacheControl });
      await documents.resolve(url, from());
      later(55);
      await documents.resolve(url, from());
      // Not a request per use: anyone sending the URL as a client_id would make this server fetch it each time.
      expect(server.hits(new URL(url).pathname)).toBe(1);
      later(10);
      await documents.resolve(url, from());
      expect(server.hits(new URL(url).pathname)).toBe(2);
    },
  );

  it('fetches again once max-age has passed', async () => {
    const url = server.json(path('expiring'), (u) => valid(u), { 'cache-control': 'max-age=600' });
    await documents.resolve(url, from());
    later(590);
    await documents.resolve(url, from());
    expect(server.hits(new URL(url).pathname)).toBe(1);
    later(20);
    await documents.resolve(url, from());
    expect(server.hits(new URL(url).pathname)).toBe(2);
  });

  it('never caches a failure: the next resolve fetches again', async () => {
    let calls = 0;
    const url = server.route(path('flaky'), (req, res) => {
      calls++;
      if (calls === 1) res.writeHead(503, { 'content-type': 'application/json', 'cache-control': 'max-age=3600' }).end('{}');
      else res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'max-age=3600' }).end(JSON.stringify(valid(`${server.origin}${req.url}`)));
    });
    await hiddenRefusal(documents.resolve(url, from()), /HTTP status 503/);
    expect((await documents.resolve(url, from())).client_id).toBe(url);
    expect(calls).toBe(2);
  });

  it('never caches an invalid document either', async () => {
    let document: Record<string, unknown> = {};
    const url = server.route(path('fixed'), (_req, res) => res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'max-age=3600' }).end(JSON.stringify(document)));
    document = valid(url, { redirect_uris: [] });
    await refusal(documents.resolve(url, from()), /no redirect_uris/);
    document = valid(url);
    expect((await documents.resolve(url, from())).redirect_uris).toEqual([REDIRECT]);
  });

  it('shares one fetch among concurrent resolves of one URL', async () => {
    const url = server.route(path('slow'), (req, res) => {
      setTimeout(() => res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' }).end(JSON.stringify(valid(`${server.origin}${req.url}`))), 200);
    });
    const rows: Application[] = await Promise.all(Array.from({ length: 8 }, () => documents.resolve(url, from())));
    expect(new Set(rows.map((r) => r.id)).size).toBe(1);
    expect(server.hits(new URL(url).pathname)).toBe(1);
  });

  it('reads the row on every use: a client disabled while its document is fresh is disabled at once, and a deleted row is fetched again', async () => {
    const url = server.json(path('disabled'), (u) => valid(u), { 'cache-control': 'max-age=3600' });
    await documents.resolve(url, from());
    await t.handle.db.updateTable('applications').set({ disabled: true }).where('client_id', '=', url).execute();
    expect((await documents.resolve(url, from())).disabled).toBe(true);
    expect(server.hits(new URL(url).pathname)).toBe(1);

    await t.handle.db.deleteFrom('applications').where('client_id', '=', url).execute();
    const again = await documents.resolve(url, from());
    expect(again).toMatchObject({ client_id: url, disabled: false });
    expect(server.hits(new URL(url).pathname)).toBe(2);
  });

  it('keeps a disabled client disabled when its document is fetched again', async () => {
    const url = server.json(path('stays-disabled'), (u) => valid(u), { 'cache-control': 'no-store' });
    await documents.resolve(url, from());
    await t.handle.db.updateTable('applications').set({ disabled: true }).where('client_id', '=', url).execute();
    later(MIN_FRESHNESS_S);
    expect((await documents.resolve(url, from())).disabled).toBe(true);
    expect(server.hits(new URL(url).pathname)).toBe(2);
  });
});

describe('what anonymous requests can make this server do', () => {
  const unusedRows = async () =>
    Number(
      (
        await t.handle.db
          .selectFrom('applications')
          .select((eb) => eb.fn.countAll<string>().as('n'))
          .where('registration', '=', 'metadata_document')
          .where('first_used_at', 'is', null)
          .executeTakeFirstOrThrow()
      ).n,
    );

  it(`fetches at most ${FETCHES_PER_MINUTE} documents not in the cache a minute for one address, an IPv6 address with its /64: then 429`, async () => {
    const limited = new ClientMetadataDocuments(t.handle.db, testConfig(env), logger, { now });
    const urls = Array.from({ length: FETCHES_PER_MINUTE + 1 }, () => server.json(path('flood'), (u) => valid(u), { 'cache-control': 'max-age=3600' }));
    for (const [i, url] of urls.slice(0, FETCHES_PER_MINUTE).entries()) {
      expect((await limited.resolve(url, { ip: `2001:db8:77:1::${(i + 1).toString(16)}` })).client_id).toBe(url);
    }
    const last = urls[FETCHES_PER_MINUTE]!;
    // Another address of the same /64, with a document of its own: refused before connecting.
    const refused = await failure(limited.resolve(last, { ip: '2001:db8:77:1:ffff:ffff:ffff:ffff' }));
    expect(refused).toBeInstanceOf(TooManyAttemptsError);
    expect((refused as TooManyAttemptsError).statusCode).toBe(429);
    expect(Number((refused as TooManyAttemptsError).headers['retry-after'])).toBeGreaterThan(0);
    expect(Number((refused as TooManyAttemptsError).headers['retry-after'])).toBeLessThanOrEqual(60);
    expect(server.hits(new URL(last).pathname)).toBe(0);
    expect(await rowOf(last)).toBeUndefined();
    // A document in the cache costs no fetch, and is still served to that address.
    expect((await limited.resolve(urls[0]!, { ip: '2001:db8:77:1::1' })).client_id).toBe(urls[0]);
    // Other addresses are not held back; the /64 is, until the minute is over.
    expect((await limited.resolve(last, { ip: '2001:db8:77:2::1' })).client_id).toBe(last);
    const another = server.json(path('flood'), (u) => valid(u));
    await expect(limited.resolve(another, { ip: '2001:db8:77:1::1' })).rejects.toBeInstanceOf(TooManyAttemptsError);
    later(60);
    expect((await limited.resolve(another, { ip: '2001:db8:77:1::1' })).client_id).toBe(another);
  });

  it('stores at most CLIENT_METADATA_MAX_CLIENTS clients that never obtained a token: past it a new document is not fetched (503), a known one still is', async () => {
    const known = server.json(path('known'), (u) => valid(u), { 'cache-control': 'no-store' });
    await documents.resolve(known, from());
    const capped = new ClientMetadataDocuments(t.handle.db, testConfig({ ...env, CLIENT_METADATA_MAX_CLIENTS: String((await unusedRows()) + 2) }), logger, { now });
    const [first, second, third] = [1, 2, 3].map(() => server.json(path('capped'), (u) => valid(u)));
    expect((await capped.resolve(first!, from())).client_id).toBe(first);
    expect((await capped.resolve(second!, from())).client_id).toBe(second);

    const refused = await failure(capped.resolve(third!, from()));
    expect(refused).toBeInstanceOf(AppError);
    expect((refused as AppError).statusCode).toBe(503);
    expect((refused as AppError).headers['retry-after']).toBe('3600');
    expect(server.hits(new URL(third!).pathname)).toBe(0);
    expect(await rowOf(third!)).toBeUndefined();
    // A client already stored is fetched again and kept up to date.
    expect((await capped.resolve(known, from())).client_id).toBe(known);
    expect(server.hits(new URL(known).pathname)).toBe(2);

    // A client that obtained a token no longer counts: room for the next.
    await t.handle.db.updateTable('applications').set({ first_used_at: new Date() }).where('client_id', '=', first!).execute();
    expect((await capped.resolve(third!, from())).client_id).toBe(third);
  });
});

describe('freshnessSeconds (RFC 9111, as a shared cache, within [0, 24 h])', () => {
  const NOW = Date.parse('2026-11-26T12:00:00Z');
  const fresh = (headers: Record<string, string>) => freshnessSeconds(new Headers(headers), NOW);

  it.each([
    [{}, DEFAULT_FRESHNESS_S],
    [{ 'cache-control': 'max-age=600' }, 600],
    [{ 'cache-control': 'public, max-age="600"' }, 600],
    [{ 'cache-control': 'max-age=600, s-maxage=60' }, 60],
    [{ 'cache-control': 'max-age=600', age: '100' }, 500],
    [{ 'cache-control': 'max-age=600', age: '1000' }, 0],
    [{ 'cache-control': 'max-age=31536000' }, MAX_FRESHNESS_S],
    [{ 'cache-control': 'max-age=-5' }, 0],
    [{ 'cache-control': 'max-age=soon' }, 0],
    [{ 'cache-control': 'no-store, max-age=600' }, 0],
    [{ 'cache-control': 'max-age=600, no-cache' }, 0],
    [{ 'cache-control': 'private, max-age=600' }, 0],
    [{ expires: 'Thu, 26 Nov 2026 12:10:00 GMT' }, 600],
    [{ expires: 'Thu, 26 Nov 2026 12:10:00 GMT', date: 'Thu, 26 Nov 2026 12:05:00 GMT' }, 300],
    [{ expires: 'Thu, 26 Nov 2026 11:00:00 GMT' }, 0],
    [{ expires: '0' }, 0],
    [{ expires: 'Thu, 26 Nov 2026 12:10:00 GMT', 'cache-control': 'max-age=60' }, 60],
  ])('%j → %i', (headers, seconds) => {
    expect(fresh(headers)).toBe(seconds);
  });
});

describe('OUTBOUND_CA_FILE', () => {
  it('must name a readable file of PEM certificates: checked at start-up', () => {
    const notPem = join(ca.caFile, '..', 'not-a-certificate.pem');
    writeFileSync(notPem, 'hello\n');
    const start = (file: string) => () => loadConfig({ SECRET_KEY: TEST_SECRET_KEY, DATA_DIR: '/nonexistent-orgauth-test', OUTBOUND_CA_FILE: file });
    expect(start(notPem)).toThrow(ConfigError);
    expect(start(notPem)).toThrow(/OUTBOUND_CA_FILE: .*holds no PEM certificate/);
    expect(start(join(ca.caFile, '..', 'missing.pem'))).toThrow(/OUTBOUND_CA_FILE: .*ENOENT/);
    expect(() => createOutboundFetch({ ...testConfig().outbound, caFile: notPem })).toThrow(/holds no PEM certificate/);
    expect(loadConfig({ SECRET_KEY: TEST_SECRET_KEY, DATA_DIR: '/nonexistent-orgauth-test', OUTBOUND_CA_FILE: ca.caFile }).outbound.caFile).toBe(ca.caFile);
  });
});
