/**
 * Sign-in through an organization's SAML 2.0 IdP (issue 25, SS-2), end to end through the pages:
 * the email-first sign-in page sends the browser to the IdP with an AuthnRequest (HTTP-Redirect),
 * the IdP (samlify, test/helpers/saml-idp.ts) answers at the ACS (HTTP-POST), /sso/finish checks
 * the browser and does the account step. Also the SP metadata, certificate rotation, IdP-initiated
 * responses, the browser binding of the finish handle, and a connection made from IdP metadata.
 * The attacks are in saml-attacks.test.ts, two instances in saml-instances.test.ts.
 */
import { X509Certificate } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createConnection, updateConnection } from '../../src/sso/connections.js';
import { BACKEND } from '../helpers/db.js';
import { pageText } from '../helpers/sso-world.js';
import { attackerKeyPair, certificateBody, createSamlIdp, DEFAULT_IDP_ENTITY_ID, generateTestKeyPair, NAMEID_FORMAT, parseAuthnRequest } from '../helpers/saml-idp.js';
import {
  acsThenFinish,
  auditReasons,
  confirmUnsolicited,
  counts,
  DOMAIN,
  newBrowser,
  orgWithVerifiedDomain,
  postToAcs,
  type SamlWorld,
  sessionsOf,
  settings,
  startAtConnection,
  startAtLogin,
  startSamlWorld,
} from '../helpers/saml-world.js';

let w: SamlWorld;

beforeAll(async () => {
  w = await startSamlWorld();
});
afterAll(async () => {
  await w?.close();
});

const userByEmail = (email: string) => w.db.selectFrom('users').selectAll().where('email', '=', email).executeTakeFirst();
const linksOf = (userId: number) => w.db.selectFrom('sso_identities').selectAll().where('user_id', '=', userId).execute();

describe(`SAML sign-in on ${BACKEND}`, () => {
  it('signs a new person in through the IdP from the email step, provisions them as a member, and reuses the link next time', async () => {
    const email = `carol@${DOMAIN}`;
    const browser = newBrowser(w.app);
    const { res, request } = await startAtLogin(browser, email, '/dashboard?from=sso');
    const location = new URL(String(res.headers.location));
    expect(`${location.origin}${location.pathname}`).toBe(w.idp.ssoUrl);
    expect(request).toMatchObject({ acsUrl: w.urls.acs_url, issuer: w.urls.entity_id, destination: w.idp.ssoUrl });
    expect(request.id).toMatch(/^_[0-9a-f]{40}$/);
    expect(await userByEmail(email)).toBeUndefined();

    const response = await w.idp.respond({ spEntityId: request.issuer, acsUrl: request.acsUrl ?? '', inResponseTo: request.id, nameId: email, attributes: { email, name: 'Carol Corp' } });
    const acs = await postToAcs(browser, w.connection.id, response);
    expect(acs.statusCode).toBe(303);
    expect(String(acs.headers.location)).toMatch(/^\/sso\/finish\?handle=[A-Za-z0-9_-]+$/);
    expect(browser.cookies.has('orgauth_session')).toBe(false);
    const finish = await browser.get(String(acs.headers.location));
    expect(finish.statusCode).toBe(303);
    expect(finish.headers.location).toBe('/dashboard?from=sso');
    expect(browser.cookies.has('orgauth_session')).toBe(true);
    expect((await browser.get('/dashboard')).statusCode).toBe(200);

    const user = await userByEmail(email);
    expect(user).toMatchObject({ name: 'Carol Corp', password_hash: null });
    const membership = await w.db.selectFrom('memberships').select('role').where('organization_id', '=', w.organizationId).where('user_id', '=', user?.id ?? 0).executeTakeFirst();
    expect(membership?.role).toBe('member');
    const links = await linksOf(user?.id ?? 0);
    expect(links).toEqual([expect.objectContaining({ connection_id: w.connection.id, issuer: w.idp.entityId, subject_format: NAMEID_FORMAT.emailAddress, subject: email, email })]);
    expect(await sessionsOf(w.db, email)).toEqual([{ amr: ['fed'], sso_connection_id: w.connection.id, user_id: user?.id, current_organization_id: w.organizationId }]);

    // Again, in another browser: a new AuthnRequest, the same link, no second user.
    const before = await counts(w.db);
    const again = newBrowser(w.app);
    const second = (await startAtLogin(again, email)).request;
    expect(second.id).not.toBe(request.id);
    const done = await acsThenFinish(again, w.connection.id, await w.idp.respond({ spEntityId: w.urls.entity_id, acsUrl: w.urls.acs_url, inResponseTo: second.id, nameId: email }));
    expect(done.statusCode).toBe(303);
    expect(done.headers.location).toBe('/dashboard');
    expect((await again.get('/dashboard')).statusCode).toBe(200);
    expect(await counts(w.db)).toEqual({ ...before, sessions: before.sessions + 1 });
    expect((await linksOf(user?.id ?? 0)).map((l) => l.id)).toEqual(links.map((l) => l.id));
  });

  it('sends ForceAuthn when the application asked for a fresh sign-in (prompt=login), and not otherwise', async () => {
    const email = `fresh@${DOMAIN}`;
    const browser = newBrowser(w.app);
    const csrf_token = await browser.csrf('/login?prompt=login');
    const res = await browser.post('/login', { csrf_token, return_to: '/dashboard', email, prompt: 'login' });
    expect(res.statusCode, res.body).toBe(303);
    expect(parseAuthnRequest(String(res.headers.location)).xml).toMatch(/ForceAuthn="true"/);
    const { request } = await startAtLogin(newBrowser(w.app), email);
    expect(request.xml).not.toMatch(/ForceAuthn="true"/);
  });

  it('serves the SP metadata an IdP admin imports; 404 for an OIDC or unknown connection', async () => {
    const res = await w.app.inject({ method: 'GET', url: new URL(w.urls.metadata_url).pathname });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/^application\/samlmetadata\+xml/);
    const xml = res.body;
    expect(w.urls.metadata_url).toBe(w.urls.entity_id);
    expect(xml).toMatch(new RegExp(`<(\\w+:)?EntityDescriptor\\b[^>]*\\bentityID="${w.urls.entity_id.replace(/[.?/]/g, '\\$&')}"`));
    const acs = /<(?:\w+:)?AssertionConsumerService\b[^>]*>/.exec(xml)?.[0] ?? '';
    expect(acs).toContain('Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST"');
    expect(acs).toContain(`Location="${w.urls.acs_url}"`);
    expect(xml).toMatch(/<(\w+:)?SPSSODescriptor\b[^>]*\bWantAssertionsSigned="true"/);

    const oidc = await createConnection(w.db, settings(w.config), w.organizationId, { protocol: 'oidc', name: 'Some OP', state: 'draft', issuer: 'https://op.example.test', client_id: 'orgauth', client_secret: 'secret' });
    expect((await w.app.inject({ method: 'GET', url: `/sso/${oidc.id}/saml/metadata` })).statusCode).toBe(404);
    expect((await w.app.inject({ method: 'GET', url: '/sso/999999/saml/metadata' })).statusCode).toBe(404);
    expect((await w.app.inject({ method: 'GET', url: '/sso/nope/saml/metadata' })).statusCode).toBe(404);
  });

  it('accepts responses signed by any certificate of the connection (rotation), not by a third', async () => {
    const oldKeys = generateTestKeyPair('old IdP key');
    const newIdp = createSamlIdp();
    const oldIdp = createSamlIdp({ keyPair: oldKeys });
    const organizationId = await orgWithVerifiedDomain(w.db, 'rotating.example');
    const connection = await createConnection(w.db, settings(w.config), organizationId, {
      protocol: 'saml',
      name: 'Rotating IdP',
      idp_entity_id: DEFAULT_IDP_ENTITY_ID,
      idp_sso_url: newIdp.ssoUrl,
      idp_certificates: [oldKeys.certificatePem, newIdp.certificatePem],
    });
    const urls = { spEntityId: connection.entity_id ?? '', acsUrl: connection.acs_url ?? '' };
    for (const [who, idp] of [['old', oldIdp], ['new', newIdp]] as const) {
      const browser = newBrowser(w.app);
      const { request } = await startAtLogin(browser, `${who}@rotating.example`);
      const done = await acsThenFinish(browser, connection.id, await idp.respond({ ...urls, inResponseTo: request.id, nameId: `${who}@rotating.example` }));
      expect(done.statusCode, who).toBe(303);
      expect(await sessionsOf(w.db, `${who}@rotating.example`)).toHaveLength(1);
    }
    const attacker = createSamlIdp({ keyPair: attackerKeyPair() });
    const browser = newBrowser(w.app);
    const { request } = await startAtLogin(browser, `third@rotating.example`);
    const refused = await postToAcs(browser, connection.id, await attacker.respond({ ...urls, inResponseTo: request.id, nameId: 'third@rotating.example' }));
    expect(refused.statusCode).toBe(400);
    expect(await userByEmail('third@rotating.example')).toBeUndefined();
    expect(await auditReasons(w.db, organizationId, 'sso.saml_response_refused')).toEqual([expect.stringMatching(/signature/i)]);
  });

  it('refuses an IdP-initiated response unless the connection accepts them, then accepts one once', async () => {
    const email = `dave@${DOMAIN}`;
    const unsolicited = () => w.idp.respond({ spEntityId: w.urls.entity_id, acsUrl: w.urls.acs_url, nameId: email });
    const browser = newBrowser(w.app);
    const refusedBefore = (await auditReasons(w.db, w.organizationId, 'sso.saml_response_refused')).length;
    const off = await postToAcs(browser, w.connection.id, await unsolicited(), '/dashboard');
    expect(off.statusCode).toBe(400);
    expect(off.body).toContain('Company sign-in failed');
    expect(browser.cookies.has('orgauth_session')).toBe(false);
    expect(await userByEmail(email)).toBeUndefined();
    expect((await auditReasons(w.db, w.organizationId, 'sso.saml_response_refused')).slice(refusedBefore)).toEqual([expect.stringMatching(/IdP-initiated/)]);

    await updateConnection(w.db, settings(w.config), w.organizationId, w.connection.id, { idp_initiated: true });
    try {
      const response = await unsolicited();
      // The IdP's page posts it from a browser that never visited orgauth: no cookie to bind to.
      const fresh = newBrowser(w.app);
      const acs = await postToAcs(fresh, w.connection.id, response, '/dashboard?idp=1');
      expect(acs.statusCode, acs.body.slice(0, 300)).toBe(303);
      const finishUrl = String(acs.headers.location);
      expect(finishUrl).toMatch(/^\/sso\/finish\?handle=[A-Za-z0-9_-]{43}$/);
      // It answers no request of ours: the browser is asked first, and the GET signs nobody in
      // (a page elsewhere could send a victim's browser there: login CSRF).
      const { page, done } = await confirmUnsolicited(fresh, finishUrl);
      expect(pageText(page.body)).toContain(`Continue as ${email}`);
      expect(page.cookies.find((c) => c.name === 'orgauth_session' && c.value !== '')).toBeUndefined();
      expect(done.statusCode, done.body.slice(0, 300)).toBe(303);
      expect(done.headers.location).toBe('/dashboard?idp=1');
      expect(fresh.cookies.has('orgauth_session')).toBe(true);
      expect(await sessionsOf(w.db, email)).toHaveLength(1);

      const replay = newBrowser(w.app);
      const again = await postToAcs(replay, w.connection.id, response, '/dashboard');
      expect(again.statusCode).toBe(400);
      expect(replay.cookies.has('orgauth_session')).toBe(false);
      expect(await sessionsOf(w.db, email)).toHaveLength(1);
      expect((await auditReasons(w.db, w.organizationId, 'sso.saml_response_refused')).at(-1)).toMatch(/replayed/);
    } finally {
      await updateConnection(w.db, settings(w.config), w.organizationId, w.connection.id, { idp_initiated: false });
    }
  });

  it('finishes a sign-in only in the browser that started it, and only once', async () => {
    const email = `erin@${DOMAIN}`;
    const browser = newBrowser(w.app);
    const { request } = await startAtLogin(browser, email);
    const acs = await postToAcs(browser, w.connection.id, await w.idp.respond({ spEntityId: w.urls.entity_id, acsUrl: w.urls.acs_url, inResponseTo: request.id, nameId: email }));
    expect(acs.statusCode).toBe(303);
    const finishUrl = String(acs.headers.location);

    const other = newBrowser(w.app);
    await other.csrf('/login'); // a browser with a pre-session cookie of its own
    const stolen = await other.get(finishUrl);
    expect(stolen.statusCode).toBe(400);
    expect(stolen.body).toContain('another browser');
    expect(other.cookies.has('orgauth_session')).toBe(false);
    const bare = newBrowser(w.app); // and one with no cookie at all
    expect((await bare.get(finishUrl)).statusCode).toBe(400);
    expect(await userByEmail(email)).toBeUndefined();
    expect(await sessionsOf(w.db, email)).toEqual([]);
    // Those attempts did not use the handle up: the browser that started finishes.
    expect((await browser.get(finishUrl)).statusCode).toBe(303);
    expect(await sessionsOf(w.db, email)).toHaveLength(1);

    // Single use: a sign-in finished once cannot be finished again.
    const mine = newBrowser(w.app);
    const second = (await startAtLogin(mine, email)).request;
    const accepted = await postToAcs(mine, w.connection.id, await w.idp.respond({ spEntityId: w.urls.entity_id, acsUrl: w.urls.acs_url, inResponseTo: second.id, nameId: email }));
    const handleUrl = String(accepted.headers.location);
    expect((await mine.get(handleUrl)).statusCode).toBe(303);
    expect(await sessionsOf(w.db, email)).toHaveLength(2);
    const twice = await mine.get(handleUrl);
    expect(twice.statusCode).toBe(400);
    expect(twice.body).toContain('was finished already');
    expect(await sessionsOf(w.db, email)).toHaveLength(2);
  });

  it('signs nobody in through a connection disabled between the AuthnRequest and the response', async () => {
    const organizationId = await orgWithVerifiedDomain(w.db, 'disabled.example');
    const connection = await createConnection(w.db, settings(w.config), organizationId, { protocol: 'saml', name: 'Soon disabled', idp_entity_id: w.idp.entityId, idp_sso_url: w.idp.ssoUrl, idp_certificates: [w.idp.certificatePem] });
    const browser = newBrowser(w.app);
    const { request } = await startAtLogin(browser, 'gina@disabled.example');
    const response = await w.idp.respond({ spEntityId: connection.entity_id ?? '', acsUrl: connection.acs_url ?? '', inResponseTo: request.id, nameId: 'gina@disabled.example' });
    await updateConnection(w.db, settings(w.config), organizationId, connection.id, { state: 'disabled' });
    const res = await postToAcs(browser, connection.id, response);
    expect(res.statusCode).toBe(403);
    expect(await userByEmail('gina@disabled.example')).toBeUndefined();
    expect(browser.cookies.has('orgauth_session')).toBe(false);
    // And the email step no longer leaves for it: the address goes on to the password step.
    const csrf_token = await browser.csrf('/login');
    expect((await browser.post('/login', { csrf_token, email: 'gina@disabled.example' })).statusCode).toBe(200);
  });

  it('makes a connection from the IdP metadata XML (entity ID, SSO URL, certificate) that signs people in', async () => {
    const idp = createSamlIdp({ entityId: 'https://login.imported.example/idp', ssoUrl: 'https://login.imported.example/sso', keyPair: generateTestKeyPair('imported IdP') });
    const organizationId = await orgWithVerifiedDomain(w.db, 'imported.example');
    const connection = await createConnection(w.db, settings(w.config), organizationId, { protocol: 'saml', name: 'Imported', idp_metadata_xml: idp.metadataXml() });
    expect(connection).toMatchObject({ idp_entity_id: idp.entityId, idp_sso_url: idp.ssoUrl, idp_initiated: false });
    const cert = new X509Certificate(idp.certificatePem);
    expect(connection.idp_certificates).toEqual([expect.objectContaining({ fingerprint_sha256: cert.fingerprint256, subject: 'CN=imported IdP' })]);
    const stored = await w.db.selectFrom('sso_connections').select('saml_idp_certificates').where('id', '=', connection.id).executeTakeFirstOrThrow();
    expect(stored.saml_idp_certificates.map(certificateBody)).toEqual([certificateBody(idp.certificatePem)]);

    const browser = newBrowser(w.app);
    const request = await startAtConnection(browser, connection.id);
    expect(request.destination).toBe(idp.ssoUrl);
    const done = await acsThenFinish(browser, connection.id, await idp.respond({ spEntityId: connection.entity_id ?? '', acsUrl: connection.acs_url ?? '', inResponseTo: request.id, nameId: 'frank@imported.example' }));
    expect(done.statusCode).toBe(303);
    expect(await sessionsOf(w.db, 'frank@imported.example')).toEqual([expect.objectContaining({ sso_connection_id: connection.id, amr: ['fed'] })]);
  });
});
