/**
 * SAML sign-in across two orgauth instances on one PostgreSQL database (issue 25, SS-2; R-6), as
 * behind a load balancer that sends the IdP's POST to either: the replay store (assertion IDs)
 * and the consumed AuthnRequests (InResponseTo) live in the database, so a response accepted by
 * one instance is refused by the other, whichever comes first, and when both get it at once.
 *
 * PostgreSQL only: the second instance has its own pool, as another process would; an embedded
 * PGlite database has one connection in one process, so there is nothing across to test.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Browser } from '../accounts/browser.js';
import { TEST_DATABASE_URL } from '../helpers/db.js';
import { auditReasons, DOMAIN, newBrowser, postToAcs, type SamlWorld, sessionsOf, startAtLogin, startSamlWorld } from '../helpers/saml-world.js';

if (!TEST_DATABASE_URL) console.log('saml-instances.test.ts: skipped: two instances need one PostgreSQL database (set TEST_DATABASE_URL)');

describe.skipIf(!TEST_DATABASE_URL)('SAML responses across two instances on one PostgreSQL database', () => {
  let w: SamlWorld;
  let a: FastifyInstance;
  let b: FastifyInstance;

  beforeAll(async () => {
    w = await startSamlWorld();
    a = w.app;
    b = await w.instance();
  });
  afterAll(async () => {
    await w?.close();
  });

  let n = 0;
  /** A person of the verified domain whose browser left for the IdP from instance A's sign-in page. */
  async function leaveFromA() {
    const email = `inst-${++n}@${DOMAIN}`;
    const browser = newBrowser(a);
    const { request } = await startAtLogin(browser, email);
    const respond = () => w.idp.respond({ spEntityId: w.urls.entity_id, acsUrl: w.urls.acs_url, inResponseTo: request.id, nameId: email });
    return { email, browser, request, respond };
  }

  /** The same browser (its cookies) talking to `app`. */
  function through(app: FastifyInstance, browser: Browser): Browser {
    const other = new Browser(app);
    for (const [name, value] of browser.cookies) other.cookies.set(name, value);
    return other;
  }

  async function finish(browser: Browser, acs: LightMyRequestResponse) {
    expect(acs.statusCode, acs.body.slice(0, 300)).toBe(303);
    const done = await browser.get(String(acs.headers.location));
    expect(done.statusCode, done.body.slice(0, 300)).toBe(303);
    expect(done.headers.location).toBe('/dashboard');
  }

  const lastRefusal = async () => (await auditReasons(w.db, w.organizationId, 'sso.saml_response_refused')).at(-1);

  it('a response accepted by A is a replay at B', async () => {
    const s = await leaveFromA();
    const response = await s.respond();
    await finish(s.browser, await postToAcs(s.browser, w.connection.id, response));
    expect(await sessionsOf(w.db, s.email)).toHaveLength(1);

    const atB = through(b, s.browser);
    const replay = await postToAcs(atB, w.connection.id, response);
    expect(replay.statusCode).toBe(400);
    expect(await lastRefusal()).toMatch(/replayed/);
    expect(await sessionsOf(w.db, s.email)).toHaveLength(1);
  });

  it('a response accepted by B (the sign-in started at A, finished at B) is a replay at A', async () => {
    const s = await leaveFromA();
    const response = await s.respond();
    const atB = through(b, s.browser);
    await finish(atB, await postToAcs(atB, w.connection.id, response));
    expect(await sessionsOf(w.db, s.email)).toEqual([expect.objectContaining({ amr: ['fed'], sso_connection_id: w.connection.id })]);

    const replay = await postToAcs(newBrowser(a), w.connection.id, response);
    expect(replay.statusCode).toBe(400);
    expect(await lastRefusal()).toMatch(/replayed/);
    expect(await sessionsOf(w.db, s.email)).toHaveLength(1);
  });

  it('a request answered at A cannot be answered again at B, by a new assertion', async () => {
    const s = await leaveFromA();
    await finish(s.browser, await postToAcs(s.browser, w.connection.id, await s.respond()));
    const second = await s.respond();
    const atB = through(b, s.browser);
    const refused = await postToAcs(atB, w.connection.id, second);
    expect(refused.statusCode).toBe(400);
    expect(await lastRefusal()).toMatch(/InResponseTo names no request/);
    expect(await sessionsOf(w.db, s.email)).toHaveLength(1);
  });

  it('the same response at A and B at once: exactly one accepts it', async () => {
    const s = await leaveFromA();
    const response = await s.respond();
    const results = await Promise.all([postToAcs(s.browser, w.connection.id, response), postToAcs(through(b, s.browser), w.connection.id, response)]);
    expect(results.map((r) => r.statusCode).sort()).toEqual([303, 400]);
    expect(await lastRefusal()).toMatch(/replayed/);
  });

  it('two different responses to one request at A and B at once: exactly one accepts', async () => {
    const s = await leaveFromA();
    const [first, second] = [await s.respond(), await s.respond()];
    const results = await Promise.all([postToAcs(s.browser, w.connection.id, first), postToAcs(through(b, s.browser), w.connection.id, second)]);
    expect(results.map((r) => r.statusCode).sort()).toEqual([303, 400]);
    expect(await lastRefusal()).toMatch(/InResponseTo names no request/);
  });
});
