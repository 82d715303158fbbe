/**
 * SAML responses an attacker (or a broken IdP) posts to orgauth's ACS (issue 25, SS-2), each
 * through the real route after a real AuthnRequest of the sign-in page. Each is refused: a 400
 * error page, no session, no user, link or membership made, and an `sso.saml_response_refused`
 * audit event whose reason names the check that refused it (so each test fails if that check is
 * removed, not merely if some other one happens to catch it). The forged responses come from
 * test/helpers/saml-idp.ts (string templates signed with xml-crypto), the valid ones from samlify.
 *
 * Time checks use explicit timestamps (minutes away from the 60 s clock skew), never waits.
 */
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_SAML_RESPONSE_BYTES } from '../../src/sso/saml-sp.js';
import type { Browser } from '../accounts/browser.js';
import { BACKEND } from '../helpers/db.js';
import { type AssertionFieldsInput, attackerKeyPair, encodeSamlResponse, NAMEID_FORMAT, type WrappingVariant } from '../helpers/saml-idp.js';
import { acsThenFinish, auditReasons, counts, DOMAIN, newBrowser, postToAcs, type SamlWorld, sessionsOf, startAtLogin, startSamlWorld } from '../helpers/saml-world.js';

let w: SamlWorld;
const CAROL = `carol@${DOMAIN}`;
const MALLORY = `mallory@${DOMAIN}`;
let carolId: number;

beforeAll(async () => {
  w = await startSamlWorld();
  // Carol signed in through the IdP before: her account and her link exist, what the attacks aim at.
  const browser = newBrowser(w.app);
  const { request } = await startAtLogin(browser, CAROL);
  const done = await acsThenFinish(browser, w.connection.id, await w.idp.respond({ spEntityId: w.urls.entity_id, acsUrl: w.urls.acs_url, inResponseTo: request.id, nameId: CAROL }));
  expect(done.statusCode).toBe(303);
  carolId = (await w.db.selectFrom('users').select('id').where('email', '=', CAROL).executeTakeFirstOrThrow()).id;
  expect(await w.db.selectFrom('sso_identities').select('subject').where('user_id', '=', carolId).execute()).toEqual([{ subject: CAROL }]);
});
afterAll(async () => {
  await w?.close();
});

const iso = (offsetMs: number) => new Date(Date.now() + offsetMs).toISOString();
const MINUTE = 60_000;

interface Attempt {
  browser: Browser;
  /** The fields of a response answering this browser's AuthnRequest, as the trusted IdP would send them for `nameId`. */
  base: AssertionFieldsInput;
  requestId: string;
}

/** A browser that left for the IdP from the sign-in page (so there is a request waiting). */
async function attempt(nameId = MALLORY): Promise<Attempt> {
  const browser = newBrowser(w.app);
  const { request } = await startAtLogin(browser, nameId.includes('@') ? nameId : MALLORY);
  return { browser, requestId: request.id, base: { acsUrl: w.urls.acs_url, spEntityId: w.urls.entity_id, nameId, inResponseTo: request.id } };
}

/**
 * Posts `samlResponse` from the attempt's browser and checks it is refused for `reason`: 400, the
 * error page, no session cookie, nothing made in the database, one audit event saying why.
 */
async function expectRefused(a: Attempt, samlResponse: string, reason: RegExp): Promise<LightMyRequestResponse> {
  const before = await counts(w.db);
  const audited = (await auditReasons(w.db, w.organizationId, 'sso.saml_response_refused')).length;
  const res = await postToAcs(a.browser, w.connection.id, samlResponse);
  expect(res.statusCode, res.body.slice(0, 300)).toBe(400);
  expect(res.body).toContain('Company sign-in failed');
  expect(res.headers.location).toBeUndefined();
  expect(a.browser.cookies.has('orgauth_session')).toBe(false);
  expect(await counts(w.db)).toEqual(before);
  expect(await sessionsOf(w.db, CAROL)).toHaveLength(1); // the one of beforeAll
  const reasons = (await auditReasons(w.db, w.organizationId, 'sso.saml_response_refused')).slice(audited);
  expect(reasons).toHaveLength(1);
  expect(reasons[0]).toMatch(reason);
  return res;
}

/** Posts a response that must be accepted, and finishes the sign-in in the same browser. */
async function expectAccepted(a: Attempt, samlResponse: string): Promise<LightMyRequestResponse> {
  const done = await acsThenFinish(a.browser, w.connection.id, samlResponse);
  expect(done.statusCode, done.body.slice(0, 300)).toBe(303);
  expect(done.headers.location).toBe('/dashboard');
  expect(a.browser.cookies.has('orgauth_session')).toBe(true);
  return done;
}

const AS_CAROL = { nameId: CAROL, email: CAROL };

describe(`SAML responses orgauth refuses, on ${BACKEND}`, () => {
  describe('signatures', () => {
    it('an unsigned response', async () => {
      const a = await attempt(CAROL);
      await expectRefused(a, w.idp.forge.unsigned(a.base), /signature/i);
    });

    it('a response signed by another key (its own certificate in KeyInfo)', async () => {
      const a = await attempt(CAROL);
      await expectRefused(a, w.idp.forge.signedBy(attackerKeyPair(), a.base), /signature/i);
    });

    it('a NameID edited after signing', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.editNameIdAfterSigning(a.base, CAROL), /signature/i);
    });

    for (const variant of ['evil-first', 'signed-in-extensions', 'signed-in-signature-object'] satisfies WrappingVariant[]) {
      it(`signature wrapping (${variant}): mallory's signed assertion, an injected one for carol`, async () => {
        const a = await attempt();
        await expectRefused(a, w.idp.forge.wrapWithInjectedAssertion(a.base, AS_CAROL, variant), /signature/i);
        expect(await w.db.selectFrom('users').select('id').where('email', '=', MALLORY).execute()).toEqual([]);
      });
    }

    it('an RSA-SHA1 signature (valid, by the trusted key)', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid(a.base, { algorithm: 'sha1' }), /xmldsig#(rsa-)?sha1/);
    });
  });

  describe('addressed elsewhere', () => {
    it('an assertion for another SP (audience)', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid({ ...a.base, audience: 'https://other-sp.example.test/metadata' }), /audience/i);
    });

    it('a Response whose Destination is another ACS', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid({ ...a.base, destination: `${w.config.issuer}/sso/999/saml/acs` }), /Destination/);
    });

    it('a bearer confirmation whose Recipient is another ACS', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid({ ...a.base, recipient: 'https://other-sp.example.test/acs' }), /SubjectConfirmation.*Recipient/);
    });

    it('an assertion issued by another IdP, signed with the trusted key', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid({ ...a.base, issuer: 'https://other-idp.example.test/metadata' }), /Issuer/);
    });
  });

  describe('time', () => {
    const longAgo = { issueInstant: iso(-10 * MINUTE), authnInstant: iso(-10 * MINUTE), notBefore: iso(-10 * MINUTE) };

    it('an expired assertion: Conditions NotOnOrAfter 2 minutes ago (beyond the 60 s skew)', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid({ ...a.base, ...longAgo, notOnOrAfter: iso(-2 * MINUTE) }), /expired/i);
    });

    it('an expired bearer confirmation: SubjectConfirmationData NotOnOrAfter 2 minutes ago', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid({ ...a.base, ...longAgo, subjectNotOnOrAfter: iso(-2 * MINUTE) }), /SubjectConfirmation.*NotOnOrAfter/);
    });

    it('an assertion issued more than an hour ago, though its NotOnOrAfter says it is valid', async () => {
      const a = await attempt();
      const old = { issueInstant: iso(-70 * MINUTE), authnInstant: iso(-70 * MINUTE), notBefore: iso(-70 * MINUTE) };
      await expectRefused(a, w.idp.forge.valid({ ...a.base, ...old }), /too old|expired|age/i);
    });

    it('an assertion not valid before 5 minutes from now (beyond the skew)', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid({ ...a.base, notBefore: iso(5 * MINUTE), notOnOrAfter: iso(10 * MINUTE), subjectNotOnOrAfter: iso(10 * MINUTE) }), /not yet valid/i);
    });

    it('an assertion issued 5 minutes in the future', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid({ ...a.base, issueInstant: iso(5 * MINUTE), authnInstant: iso(5 * MINUTE), notOnOrAfter: iso(10 * MINUTE), subjectNotOnOrAfter: iso(10 * MINUTE) }), /future/i);
    });

    it('the positive control: NotBefore and IssueInstant 30 s ahead (within the skew) are accepted', async () => {
      const email = `skewed@${DOMAIN}`;
      const a = await attempt(email);
      await expectAccepted(a, w.idp.forge.valid({ ...a.base, issueInstant: iso(30_000), authnInstant: iso(30_000), notBefore: iso(30_000) }));
      expect(await sessionsOf(w.db, email)).toEqual([expect.objectContaining({ amr: ['fed'], sso_connection_id: w.connection.id })]);
    });
  });

  describe('requests and replays', () => {
    it('an InResponseTo that names no request of ours', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.valid({ ...a.base, inResponseTo: '_0123456789abcdef0123456789abcdef01234567' }), /InResponseTo names no request/);
    });

    it('a second response to a request answered already (a new assertion ID)', async () => {
      const email = `answered@${DOMAIN}`;
      const a = await attempt(email);
      await expectAccepted(a, w.idp.forge.valid(a.base));
      // The IdP (or whoever got hold of the request ID) answers it again: a fresh assertion, so not a replay of the first.
      const again = { ...a, browser: newBrowser(w.app) };
      const second = w.idp.forge.fields(a.base);
      expect(second.inResponseTo).toBe(a.requestId);
      await expectRefused(again, w.idp.forge.valid({ ...a.base, ...second }), /InResponseTo names no request/);
      expect(await sessionsOf(w.db, email)).toHaveLength(1);
    });

    it('the same response posted twice', async () => {
      const email = `twice@${DOMAIN}`;
      const a = await attempt(email);
      const response = await w.idp.respond({ spEntityId: w.urls.entity_id, acsUrl: w.urls.acs_url, inResponseTo: a.requestId, nameId: email });
      await expectAccepted(a, response);
      await expectRefused({ ...a, browser: newBrowser(w.app) }, response, /replayed/);
      expect(await sessionsOf(w.db, email)).toHaveLength(1);
    });

    it('an IdP-initiated response (no InResponseTo) while the connection does not accept them', async () => {
      const a = await attempt(CAROL);
      await expectRefused(a, w.idp.forge.valid({ ...a.base, inResponseTo: null }), /IdP-initiated/);
    });

    it('a Response whose InResponseTo (unsigned) disagrees with the signed assertion', async () => {
      const a = await attempt();
      const other = await attempt();
      const xml = w.idp.forge.validXml({ ...a.base, inResponseTo: other.requestId });
      // The envelope now names this browser's request, the signed assertion another one's.
      const edited = xml.replace(/(<samlp:Response\b[^>]*\bInResponseTo=")[^"]*"/, `$1${a.requestId}"`);
      expect(edited).not.toBe(xml);
      await expectRefused(a, encodeSamlResponse(edited), /disagree on InResponseTo/);
    });
  });

  describe('what the IdP says', () => {
    it('a Responder status around a validly signed assertion', async () => {
      const a = await attempt(CAROL);
      await expectRefused(a, w.idp.forge.valid({ ...a.base, statusCode: 'urn:oasis:names:tc:SAML:2.0:status:Responder' }), /status:Responder/);
    });

    it('a transient NameID, validly signed: it names nobody across sign-ins, so it can be the subject of no link', async () => {
      // Mallory's address as the attribute, a transient NameID (new at each sign-in) as the subject:
      // accepted, it would provision (or link) an account to a subject that never comes back.
      const a = await attempt();
      await expectRefused(a, await w.idp.respond({ spEntityId: w.urls.entity_id, acsUrl: w.urls.acs_url, inResponseTo: a.requestId, nameId: '_3f1c0a9e7b2d4c6e8f0a1b2c3d4e5f60', nameIdFormat: NAMEID_FORMAT.transient, attributes: { email: MALLORY } }), /transient NameID/);
      // So is one carrying carol's own address as the NameID.
      const b = await attempt(CAROL);
      await expectRefused(b, w.idp.forge.valid({ ...b.base, nameIdFormat: NAMEID_FORMAT.transient }), /transient NameID/);
      expect(await w.db.selectFrom('users').select('id').where('email', '=', MALLORY).execute()).toEqual([]);
    });

    it('a comment in the NameID (CVE-2017-11427 style) is read whole: never carol', async () => {
      const nameId = `${CAROL}.evil.test`;
      const a = await attempt(MALLORY);
      const response = w.idp.forge.withCommentInNameId({ ...a.base, nameId, email: nameId }, CAROL);
      expect(Buffer.from(response, 'base64').toString('utf8')).toContain(`>${CAROL}<!---->.evil.test</saml:NameID>`);
      const before = await counts(w.db);
      const refusedBefore = (await auditReasons(w.db, w.organizationId, 'sso.sign_in_refused')).length;
      // The signature holds (exclusive c14n drops comments), so the response is accepted as what
      // it signs: the whole NameID, carol@corp.example.evil.test (orgauth reads the verified,
      // canonical bytes node-saml hands back, where the comment is gone, and reads them with
      // textContent besides), which matches carol's link by no prefix...
      const done = await acsThenFinish(a.browser, w.connection.id, response);
      // ...and whose address is in no domain the organization verified: refused at the account step.
      expect(done.statusCode).toBe(403);
      expect(done.body).toContain('not in a domain this organization has verified');
      expect(a.browser.cookies.has('orgauth_session')).toBe(false);
      expect(await counts(w.db)).toEqual(before);
      expect(await sessionsOf(w.db, CAROL)).toHaveLength(1);
      const refused = await w.db.selectFrom('audit_events').select('details').where('organization_id', '=', w.organizationId).where('action', '=', 'sso.sign_in_refused').orderBy('id').execute();
      expect(refused.slice(refusedBefore).map((r) => r.details)).toEqual([expect.objectContaining({ reason: 'email_outside_verified_domains', subject: nameId, email: nameId })]);
    });

    it('a comment in the NameID of someone else of the domain: the whole value is the subject, never the linked prefix', async () => {
      // Carol's link is by her NameID; a reading that stops at the comment in `${CAROL}<!---->x` would find it.
      const a = await attempt(MALLORY);
      const response = w.idp.forge.withCommentInNameId({ ...a.base, nameId: `${CAROL}x`, nameIdFormat: NAMEID_FORMAT.emailAddress, email: MALLORY }, CAROL);
      const done = await acsThenFinish(a.browser, w.connection.id, response);
      // Mallory (a person of the verified domain) is provisioned as herself; carol's account is not reached.
      expect(done.statusCode).toBe(303);
      const mallory = await w.db.selectFrom('users').select('id').where('email', '=', MALLORY).executeTakeFirstOrThrow();
      expect(await w.db.selectFrom('sso_identities').select(['user_id', 'subject']).where('subject', '=', `${CAROL}x`).execute()).toEqual([{ user_id: mallory.id, subject: `${CAROL}x` }]);
      expect(await sessionsOf(w.db, CAROL)).toHaveLength(1);
      expect(await sessionsOf(w.db, MALLORY)).toHaveLength(1);
    });
  });

  describe('what is not a SAML response', () => {
    it('no SAMLResponse at all', async () => {
      const a = await attempt();
      const before = await counts(w.db);
      const res = await a.browser.post(`/sso/${w.connection.id}/saml/acs`, { RelayState: '/dashboard' });
      expect(res.statusCode).toBe(400);
      expect(await counts(w.db)).toEqual(before);
    });

    it('a SAMLResponse that is not base64', async () => {
      const a = await attempt();
      await expectRefused(a, w.idp.forge.validXml(a.base), /base64/);
    });

    it('an oversized SAMLResponse (over MAX_SAML_RESPONSE_BYTES, under the body limit)', async () => {
      const a = await attempt();
      const size = Math.ceil((MAX_SAML_RESPONSE_BYTES * 4) / 3) + 1024;
      await expectRefused(a, 'A'.repeat(size), /sane size/);
    });

    it('a body over the ACS body limit: 413, before any parsing', async () => {
      const a = await attempt();
      const before = await counts(w.db);
      const res = await postToAcs(a.browser, w.connection.id, 'A'.repeat(MAX_SAML_RESPONSE_BYTES * 2 + 1024));
      expect(res.statusCode).toBe(413);
      expect(await counts(w.db)).toEqual(before);
    });

    it('base64 of something that is not XML', async () => {
      const a = await attempt();
      await expectRefused(a, Buffer.from('definitely not xml { "a": 1 }').toString('base64'), /node-saml|XML|not/i);
    });

    it('an entity-expansion payload (billion laughs) is refused at once', async () => {
      const a = await attempt();
      const entities = ['<!ENTITY l0 "lollollollollollollollollollol">'];
      for (let i = 1; i <= 9; i++) entities.push(`<!ENTITY l${i} "${`&l${i - 1};`.repeat(10)}">`);
      const xml = `<?xml version="1.0"?><!DOCTYPE samlp:Response [${entities.join('')}]><samlp:Response xmlns:samlp="urn:oasis:names:tc:SAML:2.0:protocol" ID="_x" Version="2.0" IssueInstant="${iso(0)}">&l9;</samlp:Response>`;
      const started = performance.now();
      await expectRefused(a, encodeSamlResponse(xml), /DOCTYPE|signature|entity|XML/i);
      expect(performance.now() - started).toBeLessThan(10_000);
    });

    it('a DOCTYPE in front of a validly signed response', async () => {
      const a = await attempt();
      const xml = w.idp.forge.validXml(a.base);
      await expectRefused(a, encodeSamlResponse(`<?xml version="1.0"?><!DOCTYPE samlp:Response [<!ENTITY x "x">]>${xml}`), /DOCTYPE/);
    });
  });
});
