/**
 * Which account a company sign-in may reach, after the security review of the SSO account step
 * (src/sso/identities.ts, src/web/sso-pages.ts, src/web/sign-in.ts, src/web/email-links.ts), end
 * to end on both databases through the pages, the world's upstream OpenID provider and, for
 * IdP-initiated responses, a SAML IdP (test/helpers/saml-idp.ts). Each block fails if its fix
 * is taken out:
 *
 * 1. The provider's email is compared in one canonical form (ASCII lower case, the IDNA domain):
 *    `victim@bİzcorp.example` (a dotted capital I, which the database's lower() folds to i) is
 *    the address at xn--bi-...; an organization that verified that IDN domain gets no account at
 *    bizcorp.example. An account the database's lower() finds must have exactly the address, and
 *    a non-ASCII local part is no address to compare (email_unusable).
 * 2. An account nobody proved the address of (a sign-up never confirmed) is reclaimed when the
 *    organization's IdP vouches for its address: password, sessions and grants end.
 * 3. An IdP-initiated SAML response is confirmed by the browser (GET signs nobody in), and one
 *    that needs an account's proof is refused rather than led to /sso/link.
 * 4. Only a connection an owner (or the operator) vouched for links an existing account by its
 *    verified email without its proof.
 * 5. SSO required is decided by the account's stored address too (`alice@bİzreq.example`).
 * 6. No password account through /signup or /invitation/signup at an SSO-required domain.
 * 7. Just-in-time provisioning never adds back someone the organization removed.
 * 8. The proof /sso/link asks for is a sign-in made after the link was parked.
 *
 * The İ cases depend on the database folding İ to i in lower(): PostgreSQL's C and C.UTF-8
 * collations and PGlite's do (checked in beforeAll); under a collation that does not (lower('İ')
 * is then 'i̇', never matching an ASCII address) the attack cannot happen, and those tests are
 * skipped with a note.
 */
import { sql } from 'kysely';
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization, removeMember } from '../../src/accounts/organizations.js';
import { builtinRole } from '../../src/accounts/roles.js';
import { createUser } from '../../src/accounts/users.js';
import { ForbiddenError } from '../../src/errors.js';
import { openText, sha256Hex } from '../../src/lib/crypto.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { createGrant } from '../../src/oauth/models/grants.js';
import { type ConnectionActor, createConnection, updateConnection } from '../../src/sso/connections.js';
import { REFUSAL_MESSAGES } from '../../src/sso/identities.js';
import { addDomain, normalizeDomain, txtLookup, verifyDomain } from '../../src/sso/domains.js';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND } from '../helpers/db.js';
import { hiddenFields } from '../helpers/oidc-world.js';
import { createSamlIdp, type TestSamlIdp } from '../helpers/saml-idp.js';
import {
  auditEvents,
  pageText,
  postEmail,
  signInThroughSso,
  type SsoOrganization,
  ssoOrganization,
  type SsoWorld,
  startAt,
  startSsoWorld,
  unescapeHtml,
  upstreamCallback,
} from '../helpers/sso-world.js';

const PASSWORD = 'a local password 123';
const OWNER_PASSWORD = 'owner password 123';
const CSRF = 'This form has expired or did not come from this site.';
const SSO_REQUIRED = 'Your organization signs you in through its identity provider. Choose Continue to sign in with your company account.';

let world: SsoWorld;
/** Whether the database's lower() folds İ (U+0130) to an ASCII i. */
let foldsDottedI = false;
let n = 0;
const db = () => world.db;
const newBrowser = () => new Browser(world.app, `10.28.${Math.floor(++n / 250)}.${(n % 250) + 1}`);

beforeAll(async () => {
  world = await startSsoWorld();
  const { rows } = await sql<{ folds: boolean }>`select lower(${'İ'}) = 'i' as folds`.execute(world.db);
  foldsDottedI = rows[0]!.folds;
}, 60_000);
afterAll(async () => {
  await world?.close();
});

/** An upstream account `login` asserting `email` (verified unless said otherwise). */
function upstreamAccount(login: string, email: string, emailVerified = true): string {
  world.upstream.setAccount(login, { sub: `${login}-sub`, email, email_verified: emailVerified, name: `${login} Upstream` });
  return email;
}

const userByEmail = (email: string) => db().selectFrom('users').selectAll().where('email', '=', email).executeTakeFirst();
const identitiesOf = (userId: number) => db().selectFrom('sso_identities').select(['connection_id', 'subject', 'email']).where('user_id', '=', userId).orderBy('id').execute();
const sessionsOf = (userId: number) => db().selectFrom('sessions').select(['amr', 'sso_connection_id', 'created_at']).where('user_id', '=', userId).orderBy('id').execute();
const membership = (organizationId: number, userId: number) =>
  db().selectFrom('memberships').select('role').where('organization_id', '=', organizationId).where('user_id', '=', userId).executeTakeFirst();
/** The organization's removal of the user, unless someone added them back since (the row stays, restored). */
const removal = (organizationId: number, userId: number) =>
  db().selectFrom('removed_members').select('user_id').where('organization_id', '=', organizationId).where('user_id', '=', userId).where('restored_at', 'is', null).executeTakeFirst();
/** The user a browser's session belongs to (its cookie is the session id; the table keeps its hash). */
async function signedInAs(browser: Browser): Promise<number | undefined> {
  const id = browser.cookies.get('orgauth_session');
  if (id === undefined) return undefined;
  const row = await db().selectFrom('sessions').select('user_id').where('id_hash', '=', sha256Hex(id)).where('expires_at', '>', new Date()).executeTakeFirst();
  return row?.user_id;
}
/** The text of a page's <main>. */
const mainText = (res: LightMyRequestResponse) => pageText(/<main>([\s\S]*)<\/main>/.exec(res.body)?.[1] ?? res.body);

function expectRefusal(res: LightMyRequestResponse, reason: keyof typeof REFUSAL_MESSAGES) {
  expect(res.statusCode, res.body.slice(0, 400)).toBe(403);
  expect(mainText(res)).toBe(`Company sign-in refused ${REFUSAL_MESSAGES[reason]} Sign in again`);
  expect(res.cookies.find((c) => c.name === 'orgauth_session' && c.value !== '')).toBeUndefined();
}

/** The messages queued for `to`, opened, once `count` are there. */
async function mailTo(to: string, count: number) {
  await expect.poll(async () => (await db().selectFrom('mail_outbox').select('id').where('recipient', '=', to).execute()).length, { timeout: 10_000 }).toBe(count);
  const rows = await db().selectFrom('mail_outbox').select(['subject', 'body_encrypted']).where('recipient', '=', to).orderBy('id').execute();
  return rows.map((r) => ({ subject: r.subject, ...(JSON.parse(openText(TEST_SECRET_KEY, 'mail-outbox', r.body_encrypted!)) as { text: string; html: string }) }));
}

/** The organization's owner, signed in with a password in a browser of their own. */
async function ownerBrowser(org: SsoOrganization): Promise<Browser> {
  const owner = await db().selectFrom('users').select('email').where('id', '=', org.ownerId).executeTakeFirstOrThrow();
  const browser = newBrowser();
  expect((await browser.login(owner.email, OWNER_PASSWORD)).statusCode).toBe(303);
  return browser;
}

/** The owner invites `email` from the dashboard; the invitation link's token, from the mail. */
async function invite(org: SsoOrganization, email: string): Promise<string> {
  const owner = await ownerBrowser(org);
  const page = await owner.get('/dashboard/members');
  const sent = await owner.post('/dashboard/invitations', { csrf_token: csrfTokenIn(page.body), email, role: 'member' });
  expect(sent.statusCode, sent.body.slice(0, 300)).toBe(303);
  expect((await owner.get(String(sent.headers.location))).body).toContain(`Invitation sent to ${email}`);
  const [mail] = await mailTo(email, 1);
  const token = /\/invitation\?token=([A-Za-z0-9_-]+)/.exec(mail!.text)?.[1];
  expect(token).toBeDefined();
  return token!;
}

describe(`(1) the provider's email in one canonical form on ${BACKEND}`, () => {
  let corp: SsoOrganization;
  beforeAll(async () => {
    corp = await ssoOrganization(world, { domain: 'canon.example', name: 'Canon Corp' });
  });

  it('an organization that verified the IDN bİzcorp.example (xn--) reaches no account at bizcorp.example, though lower() folds the two together', async (ctx) => {
    if (!foldsDottedI) return ctx.skip('this database’s lower() does not fold İ to i: the look-alike cannot match the ASCII address');
    // The victim: an ordinary account, its address confirmed.
    const victim = await createUser(db(), { email: 'victim@bizcorp.example', password: PASSWORD, name: 'Victim' });
    const { rows } = await sql<{ same: boolean }>`select lower(${'victim@bİzcorp.example'}) = 'victim@bizcorp.example' as same`.execute(db());
    expect(rows[0]!.same).toBe(true);
    // The attacker's organization proves the IDN domain (it can: it is another domain) and points a connection at an IdP of its own.
    const idn = normalizeDomain('bİzcorp.example');
    expect(idn).toMatch(/^xn--[a-z0-9-]+\.example$/);
    const attacker = await ssoOrganization(world, { domain: 'bİzcorp.example', name: 'Look-alike Ltd' });
    upstreamAccount('mallory-idn', 'victim@bİzcorp.example');

    const browser = newBrowser();
    const res = await browser.get(await upstreamCallback(world, await startAt(browser, attacker.connectionId), 'mallory-idn'));
    // The address is the IDN domain's: a new person there (the organization's own domain), never the victim.
    expect(res.statusCode, res.body.slice(0, 300)).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    const provisioned = await userByEmail(`victim@${idn}`);
    expect(provisioned).toBeDefined();
    expect(provisioned!.id).not.toBe(victim.id);
    expect(await signedInAs(browser)).toBe(provisioned!.id);
    expect(await identitiesOf(victim.id)).toEqual([]);
    expect(await sessionsOf(victim.id)).toEqual([]);
    expect(await membership(attacker.organizationId, victim.id)).toBeUndefined();
    expect((await auditEvents(world, attacker.organizationId, 'sso.identity_linked')).map((e) => e.details)).toEqual([]);
  });

  it('an account lower() finds under another spelling (mİa@ for mia@) is not the address the provider named: refused, not linked', async (ctx) => {
    if (!foldsDottedI) return ctx.skip('this database’s lower() does not fold İ to i: no account is found under another spelling');
    // Someone registered the look-alike spelling of a colleague's address, confirmed it, and keeps a session.
    const lookalike = await createUser(db(), { email: 'mİa@canon.example', password: PASSWORD, name: 'Not Mia' });
    const squatter = newBrowser();
    expect((await squatter.login('mİa@canon.example', PASSWORD)).statusCode).toBe(303);
    upstreamAccount('mia', 'mia@canon.example');

    const browser = newBrowser();
    const res = await signInThroughSso(world, browser, 'mia@canon.example', 'mia');
    expectRefusal(res, 'email_unusable');
    expect(await identitiesOf(lookalike.id)).toEqual([]);
    expect(await sessionsOf(lookalike.id)).toHaveLength(1); // the squatter's own, nobody else's
    expect(await membership(corp.organizationId, lookalike.id)).toBeUndefined();
    expect((await auditEvents(world, corp.organizationId, 'sso.sign_in_refused')).map((e) => e.details)).toContainEqual({
      connection_id: corp.connectionId, reason: 'email_unusable', subject: 'mia-sub', email: 'mia@canon.example',
    });
  });

  it('a non-ASCII local part is no address to compare (its case folding differs between JavaScript and the database): email_unusable, nobody made', async () => {
    upstreamAccount('nina', 'nİna@canon.example');
    const browser = newBrowser();
    const res = await browser.get(await upstreamCallback(world, await startAt(browser, corp.connectionId), 'nina'));
    expectRefusal(res, 'email_unusable');
    expect(await db().selectFrom('users').select('id').where(sql<string>`lower(email)`, 'like', 'n%na@canon.example').execute()).toEqual([]);
    expect((await auditEvents(world, corp.organizationId, 'sso.sign_in_refused')).map((e) => e.details)).toContainEqual({
      connection_id: corp.connectionId, reason: 'email_unusable', subject: 'nina-sub', email: 'nİna@canon.example',
    });
  });
});

describe(`(2) an account nobody proved the address of, reclaimed on ${BACKEND}`, () => {
  let corp: SsoOrganization;
  beforeAll(async () => {
    corp = await ssoOrganization(world, { domain: 'reclaim.example', name: 'Reclaim Corp' });
  });

  it('someone signed up as ceo@ before the CEO arrived: the SSO sign-in links the account and ends what the squatter held', async () => {
    // Sign-up no longer makes an account before the address is confirmed: the squatter's sign-up makes none.
    const squatter = newBrowser();
    const csrf_token = await squatter.csrf('/signup');
    const signedUp = await squatter.post('/signup', { csrf_token, email: 'ceo@reclaim.example', password: PASSWORD, name: 'Not the CEO', organization_name: 'Squatter Org' });
    expect(signedUp.statusCode, signedUp.body.slice(0, 300)).toBe(200);
    expect(await userByEmail('ceo@reclaim.example')).toBeUndefined();
    // An account on the CEO's address that nobody ever confirmed can still exist (made by an operator
    // with emailVerified false, or by a sign-up before links confirmed addresses): the squatter holds
    // one, keeps the session, and gives an application a grant.
    const made = await createUser(db(), { email: 'ceo@reclaim.example', password: PASSWORD, name: 'Not the CEO', emailVerified: false });
    await createOrganization(db(), { name: 'Squatter Org', ownerUserId: made.id });
    expect((await squatter.login('ceo@reclaim.example', PASSWORD)).statusCode).toBe(303);
    expect((await squatter.get('/dashboard')).statusCode).toBe(200);
    const account = (await userByEmail('ceo@reclaim.example'))!;
    expect(account.email_verified_at).toBeNull();
    const squatterOrg = (await db().selectFrom('memberships').select('organization_id').where('user_id', '=', account.id).executeTakeFirstOrThrow()).organization_id;
    const application = await createApplication(db(), { organizationId: squatterOrg, type: 'private', name: 'Exfiltrator', scopes: 'contacts.read' });
    const applicationId = (await db().selectFrom('applications').select('id').where('client_id', '=', application.client_id).executeTakeFirstOrThrow()).id;
    const grant = await createGrant(db(), { organizationId: squatterOrg, applicationId, userId: account.id, scopes: ['contacts.read'] });
    expect(grant).toBeDefined();
    // And links the account to an IdP of its own (a connection of its organization, proved with the password).
    const own = await createConnection(db(), world.settings, squatterOrg, { protocol: 'saml', name: 'Squatter IdP', idp_entity_id: 'https://squatter.example', idp_sso_url: 'https://squatter.example/sso', idp_certificates: [createSamlIdp().certificatePem] });
    await db().insertInto('sso_identities').values({ connection_id: own.id, user_id: account.id, issuer: 'https://squatter.example', subject_format: 'urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress', subject: 'ceo@reclaim.example', email: 'ceo@reclaim.example' }).execute();

    // The real CEO signs in through the company's IdP, which vouches for the address.
    upstreamAccount('ceo', 'ceo@reclaim.example');
    const ceo = newBrowser();
    const res = await signInThroughSso(world, ceo, 'ceo@reclaim.example', 'ceo');
    expect(res.statusCode, res.body.slice(0, 300)).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    expect(await signedInAs(ceo)).toBe(account.id);
    expect(await identitiesOf(account.id)).toEqual([{ connection_id: corp.connectionId, subject: 'ceo-sub', email: 'ceo@reclaim.example' }]);
    expect(await membership(corp.organizationId, account.id)).toEqual({ role: 'member' });

    // What the squatter held is gone: the session, the password, the grant.
    const squatterPage = await squatter.get('/dashboard');
    expect(squatterPage.statusCode).toBe(303);
    expect(squatterPage.headers.location).toMatch(/^\/login/);
    expect((await sessionsOf(account.id)).map((s) => s.sso_connection_id)).toEqual([corp.connectionId]);
    const again = await newBrowser().login('ceo@reclaim.example', PASSWORD);
    expect(again.statusCode).toBe(400);
    expect(pageText(again.body)).toContain('Incorrect email or password.');
    const reclaimed = (await userByEmail('ceo@reclaim.example'))!;
    expect(reclaimed.password_hash).toBeNull();
    expect(reclaimed.email_verified_at).toBeInstanceOf(Date);
    expect(await db().selectFrom('grants').select(['revoked_reason']).where('id', '=', grant!.id).executeTakeFirstOrThrow()).toEqual({ revoked_reason: 'account_reclaimed' });

    // Said on the account and in the organization.
    const accountEvents = await db().selectFrom('account_events').select(['action', 'details']).where('user_id', '=', account.id).where('action', '=', 'sso.unverified_account_reclaimed').execute();
    expect(accountEvents).toEqual([{ action: 'sso.unverified_account_reclaimed', details: { connection_id: corp.connectionId, organization_id: corp.organizationId } }]);
    expect((await auditEvents(world, corp.organizationId, 'sso.unverified_account_reclaimed')).map((e) => e.details)).toEqual([{ connection_id: corp.connectionId, user_id: account.id }]);
  });

  it('a sign-in refused for another reason (JIT off, not a member) reclaims nothing: the account keeps its password', async () => {
    await ssoOrganization(world, { domain: 'no-reclaim.example', name: 'No Reclaim Corp', jit: false });
    await createUser(db(), { email: 'cto@no-reclaim.example', password: PASSWORD, name: 'CTO', emailVerified: false });
    upstreamAccount('cto', 'cto@no-reclaim.example');
    const res = await signInThroughSso(world, newBrowser(), 'cto@no-reclaim.example', 'cto');
    expect(res.statusCode).toBe(403);
    const kept = (await userByEmail('cto@no-reclaim.example'))!;
    expect(kept.password_hash).not.toBeNull();
    expect(kept.email_verified_at).toBeNull();
    expect((await newBrowser().login('cto@no-reclaim.example', PASSWORD)).statusCode).toBe(303);
  });

  it('an account whose address was confirmed is linked as it is: its password and sessions stay', async () => {
    const cfo = await createUser(db(), { email: 'cfo@reclaim.example', password: PASSWORD, name: 'CFO' });
    const laptop = newBrowser();
    expect((await laptop.login('cfo@reclaim.example', PASSWORD)).statusCode).toBe(303);
    upstreamAccount('cfo', 'cfo@reclaim.example');
    const res = await signInThroughSso(world, newBrowser(), 'cfo@reclaim.example', 'cfo');
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    expect((await laptop.get('/dashboard')).statusCode).toBe(200);
    expect((await newBrowser().login('cfo@reclaim.example', PASSWORD)).statusCode).toBe(303);
    expect(await db().selectFrom('account_events').select('id').where('user_id', '=', cfo.id).where('action', '=', 'sso.unverified_account_reclaimed').execute()).toEqual([]);
  });
});

describe(`(3) IdP-initiated SAML responses on ${BACKEND}`, () => {
  let org: SsoOrganization;
  let idp: TestSamlIdp;
  let connectionId: number;
  const urls = () => ({ spEntityId: `${world.issuer}/sso/${connectionId}/saml/metadata`, acsUrl: `${world.issuer}/sso/${connectionId}/saml/acs` });

  beforeAll(async () => {
    org = await ssoOrganization(world, { domain: 'portal.example', name: 'Portal Corp', connections: 0 });
    idp = createSamlIdp();
    // Made by the operator, who chose not to let it link existing accounts without their proof.
    connectionId = (
      await createConnection(db(), world.settings, org.organizationId, {
        protocol: 'saml',
        name: 'Portal IdP',
        idp_entity_id: idp.entityId,
        idp_sso_url: idp.ssoUrl,
        idp_certificates: [idp.certificatePem],
        idp_initiated: true,
        links_existing_accounts: false,
      })
    ).id;
  });

  /** The IdP's portal posts an unsolicited response for `nameId` from `browser`: the /sso/finish URL it is sent to. */
  async function fromPortal(browser: Browser, nameId: string, relayState = '/dashboard?from=portal'): Promise<string> {
    const posted = await browser.post(`/sso/${connectionId}/saml/acs`, { SAMLResponse: await idp.respond({ ...urls(), nameId }), RelayState: relayState });
    expect(posted.statusCode, posted.body.slice(0, 300)).toBe(303);
    const location = String(posted.headers.location);
    expect(location).toMatch(/^\/sso\/finish\?handle=[A-Za-z0-9_-]{43}$/);
    return location;
  }

  const sessionCount = async () => Number((await db().selectFrom('sessions').select((eb) => eb.fn.countAll<number>().as('n')).executeTakeFirstOrThrow()).n);
  const confirmForm = (html: string) => ({ csrf_token: /name="csrf_token" value="([^"]+)"/.exec(html)?.[1] ?? '', handle: /name="handle" value="([^"]+)"/.exec(html)?.[1] ?? '' });

  it('asks the browser first: the GET signs nobody in, a POST without the page’s CSRF token is refused, the confirmed one signs in', async () => {
    const email = 'pia@portal.example';
    const browser = newBrowser();
    const finish = await fromPortal(browser, email);
    const before = await sessionCount();

    const page = await browser.get(finish);
    expect(page.statusCode, page.body.slice(0, 300)).toBe(200);
    expect(page.body).toContain('<form method="post" action="/sso/finish">');
    expect(mainText(page)).toContain(`sent a sign-in for ${email} that this browser did not start here`);
    expect(mainText(page)).toContain(`Continue as ${email}`);
    expect(page.cookies.find((c) => c.name === 'orgauth_session' && c.value !== '')).toBeUndefined();
    // Opened again (a reload, or a page elsewhere sending the browser there twice): still only the question.
    expect((await browser.get(finish)).statusCode).toBe(200);
    expect(browser.cookies.has('orgauth_session')).toBe(false);
    expect(await sessionCount()).toBe(before);
    expect(await userByEmail(email)).toBeUndefined();

    const form = confirmForm(page.body);
    expect(form.handle).toBe(new URL(finish, world.issuer).searchParams.get('handle'));
    // A cross-site POST carries no token: refused, nothing spent.
    const forged = await browser.post('/sso/finish', { handle: form.handle });
    expect(forged.statusCode).toBe(403);
    expect(pageText(forged.body)).toContain(CSRF);
    // Nor does the token of the page another browser (the attacker's) was shown.
    const attacker = newBrowser();
    const theirs = confirmForm((await attacker.get(finish)).body);
    expect((await browser.post('/sso/finish', { csrf_token: theirs.csrf_token, handle: form.handle })).statusCode).toBe(403);
    expect(browser.cookies.has('orgauth_session')).toBe(false);
    expect(await sessionCount()).toBe(before);

    const done = await browser.post('/sso/finish', form);
    expect(done.statusCode, done.body.slice(0, 300)).toBe(303);
    expect(done.headers.location).toBe('/dashboard?from=portal');
    const pia = (await userByEmail(email))!;
    expect(await signedInAs(browser)).toBe(pia.id);
    expect(await sessionsOf(pia.id)).toHaveLength(1);
    // Once: the handle is spent (another browser opening it finds nothing to confirm).
    const spent = await newBrowser().get(finish);
    expect(spent.statusCode).toBe(400);
    expect(pageText(spent.body)).toContain('This sign-in has expired, was finished already, or was started in another browser.');
    expect(await sessionsOf(pia.id)).toHaveLength(1);
  });

  it('an unsolicited response naming an existing account that needs its proof: refused (403), never the /sso/link page', async () => {
    const paul = await createUser(db(), { email: 'paul@portal.example', password: PASSWORD, name: 'Paul Local' });
    // Paul is signed in to his account in this browser: the page that asks to confirm a link is what an attacker would want him to see.
    const browser = newBrowser();
    expect((await browser.login('paul@portal.example', PASSWORD)).statusCode).toBe(303);
    const finish = await fromPortal(browser, 'paul@portal.example');
    const page = await browser.get(finish);
    expect(page.statusCode).toBe(200);
    const res = await browser.post('/sso/finish', confirmForm(page.body));
    expect(res.statusCode, res.body.slice(0, 300)).toBe(403);
    expect(res.headers.location).toBeUndefined();
    expect(mainText(res)).toBe('Company sign-in refused To connect your company sign-in to an account here, start from the sign-in page: enter your email address and choose Continue. Sign in again');
    expect(res.body).not.toContain('/sso/link');
    expect(await identitiesOf(paul.id)).toEqual([]);
    // Nothing waits for Paul's proof.
    const parked = await db().selectFrom('sso_sign_ins').select('id').where('connection_id', '=', connectionId).where(sql<boolean>`(result -> 'userId') is not null`).execute();
    expect(parked).toEqual([]);
    expect((await auditEvents(world, org.organizationId, 'sso.link_needs_proof')).map((e) => e.details)).toEqual([
      { connection_id: connectionId, user_id: paul.id, reason: 'connection_not_vouched_by_owner' },
    ]);
  });
});

describe(`(4) who vouches for a connection on ${BACKEND}`, () => {
  const domain = 'vouch.example';
  let organizationId: number;
  let adminBy: ConnectionActor;
  let ownerBy: ConnectionActor;
  let clients = 0;

  beforeAll(async () => {
    const boss = await createUser(db(), { email: `boss@${domain}`, password: PASSWORD, name: 'Boss' });
    organizationId = (await createOrganization(db(), { name: 'Vouch Corp', ownerUserId: boss.id })).id;
    const admin = await createUser(db(), { email: 'ada@admins.example', password: PASSWORD, name: 'Ada Admin' });
    await addMember(db(), { organizationId, userId: admin.id, role: 'admin' });
    adminBy = { actor: { actorUserId: admin.id }, actingAs: builtinRole('admin') };
    ownerBy = { actor: { actorUserId: boss.id }, actingAs: builtinRole('owner') };
    const claimed = await addDomain(db(), organizationId, { domain });
    world.dns.setTxt(claimed.verification.name, [claimed.verification.value]);
    expect((await verifyDomain(db(), txtLookup(world.config.dnsServers), organizationId, domain)).state).toBe('verified');
    upstreamAccount('boss', `boss@${domain}`);
  });

  /** A connection to the world's upstream made by `by`, its client registered there. */
  async function connect(by: ConnectionActor, name: string, extra: Record<string, unknown> = {}) {
    const client_id = `vouch-${++clients}`;
    const client_secret = `vouch-secret-${clients}-0123456789abcdef`;
    const view = await createConnection(db(), world.settings, organizationId, { protocol: 'oidc', name, issuer: world.upstream.issuer, client_id, client_secret, ...extra }, by);
    world.upstream.registerClient({ client_id, client_secret, redirect_uris: [view.redirect_uri!] });
    return { ...view, client_secret };
  }

  async function through(connectionId: number, login: string): Promise<LightMyRequestResponse> {
    const browser = newBrowser();
    return browser.get(await upstreamCallback(world, await startAt(browser, connectionId), login));
  }

  const lastNeedsProof = async () => (await auditEvents(world, organizationId, 'sso.link_needs_proof')).at(-1)?.details;

  it('an admin’s connection links no existing account without its proof (the owner’s included); an owner’s does', async () => {
    const boss = (await userByEmail(`boss@${domain}`))!;
    const byAdmin = await connect(adminBy, 'Admin’s IdP');
    expect(byAdmin.links_existing_accounts).toBe(false);
    const viaAdmin = await through(byAdmin.id, 'boss');
    expect(viaAdmin.statusCode, viaAdmin.body.slice(0, 300)).toBe(303);
    expect(String(viaAdmin.headers.location)).toMatch(/^\/sso\/link\?handle=/);
    expect(await identitiesOf(boss.id)).toEqual([]);
    expect(await sessionsOf(boss.id)).toEqual([]);
    expect(await lastNeedsProof()).toEqual({ connection_id: byAdmin.id, user_id: boss.id, reason: 'connection_not_vouched_by_owner' });

    const byOwner = await connect(ownerBy, 'Owner’s IdP');
    expect(byOwner.links_existing_accounts).toBe(true);
    const viaOwner = await through(byOwner.id, 'boss');
    expect(viaOwner.statusCode, viaOwner.body.slice(0, 300)).toBe(303);
    expect(viaOwner.headers.location).toBe('/dashboard');
    expect(await identitiesOf(boss.id)).toEqual([{ connection_id: byOwner.id, subject: 'boss-sub', email: `boss@${domain}` }]);
    expect((await auditEvents(world, organizationId, 'sso.identity_linked')).map((e) => e.details)).toContainEqual({ connection_id: byOwner.id, user_id: boss.id, how: 'verified_domain' });

    // Just-in-time provisioning of someone new is not linking: an admin's connection makes new members.
    upstreamAccount('newcomer', `newcomer@${domain}`);
    const newcomer = await through(byAdmin.id, 'newcomer');
    expect(newcomer.statusCode).toBe(303);
    expect(newcomer.headers.location).toBe('/dashboard');
  });

  it('an admin may not turn linking on (403), at creation or later; turning it off is theirs', async () => {
    await expect(connect(adminBy, 'Sneaky', { links_existing_accounts: true })).rejects.toThrow(ForbiddenError);
    expect(await db().selectFrom('sso_connections').select('id').where('name', '=', 'Sneaky').execute()).toEqual([]);
    const mine = await connect(adminBy, 'Admin’s other IdP');
    await expect(updateConnection(db(), world.settings, organizationId, mine.id, { links_existing_accounts: true }, adminBy)).rejects.toThrow(ForbiddenError);
    expect((await db().selectFrom('sso_connections').select('links_existing_accounts').where('id', '=', mine.id).executeTakeFirstOrThrow()).links_existing_accounts).toBe(false);
    const owners = await connect(ownerBy, 'Owner’s other IdP');
    expect((await updateConnection(db(), world.settings, organizationId, owners.id, { links_existing_accounts: false }, adminBy)).links_existing_accounts).toBe(false);
    // An owner vouches for it again.
    expect((await updateConnection(db(), world.settings, organizationId, owners.id, { links_existing_accounts: true }, ownerBy)).links_existing_accounts).toBe(true);
  });

  it('an admin changing what the connection trusts turns linking off; an owner’s change, or an admin’s of anything else, keeps it', async () => {
    const deputy = await createUser(db(), { email: `deputy@${domain}`, password: PASSWORD, name: 'Deputy' });
    upstreamAccount('deputy', `deputy@${domain}`);
    const c = await connect(ownerBy, 'Vouched IdP');
    const links = async () => (await db().selectFrom('sso_connections').select('links_existing_accounts').where('id', '=', c.id).executeTakeFirstOrThrow()).links_existing_accounts;

    expect((await updateConnection(db(), world.settings, organizationId, c.id, { name: 'Vouched IdP (renamed)', jit: true }, adminBy)).links_existing_accounts).toBe(true);
    expect((await updateConnection(db(), world.settings, organizationId, c.id, { client_secret: c.client_secret }, ownerBy)).links_existing_accounts).toBe(true);
    // The admin sets the client secret (the same one, so the upstream still answers): whom the connection trusts is the admin's word now.
    const changed = await updateConnection(db(), world.settings, organizationId, c.id, { client_secret: c.client_secret }, adminBy);
    expect(changed.links_existing_accounts).toBe(false);
    expect(await links()).toBe(false);
    const updates = await db().selectFrom('audit_events').select('details').where('organization_id', '=', organizationId).where('action', '=', 'sso_connection.updated').orderBy('id').execute();
    expect(updates.at(-1)!.details).toMatchObject({ connection_id: c.id, changed: ['client_secret', 'links_existing_accounts'] });

    // So the deputy's account needs its proof.
    const res = await through(c.id, 'deputy');
    expect(String(res.headers.location)).toMatch(/^\/sso\/link\?handle=/);
    expect(await identitiesOf(deputy.id)).toEqual([]);
    expect(await lastNeedsProof()).toEqual({ connection_id: c.id, user_id: deputy.id, reason: 'connection_not_vouched_by_owner' });

    // The owner vouches again: linked at once.
    await updateConnection(db(), world.settings, organizationId, c.id, { links_existing_accounts: true }, ownerBy);
    const linked = await through(c.id, 'deputy');
    expect(linked.headers.location).toBe('/dashboard');
    expect(await identitiesOf(deputy.id)).toEqual([{ connection_id: c.id, subject: 'deputy-sub', email: `deputy@${domain}` }]);

    // Every trust field counts, on SAML connections too.
    const idp = createSamlIdp();
    const saml = await createConnection(db(), world.settings, organizationId, { protocol: 'saml', name: 'SAML IdP', idp_entity_id: idp.entityId, idp_sso_url: idp.ssoUrl, idp_certificates: [idp.certificatePem] }, ownerBy);
    expect(saml.links_existing_accounts).toBe(true);
    expect((await updateConnection(db(), world.settings, organizationId, saml.id, { idp_initiated: true }, adminBy)).links_existing_accounts).toBe(true);
    expect((await updateConnection(db(), world.settings, organizationId, saml.id, { idp_sso_url: 'https://elsewhere.example/sso' }, adminBy)).links_existing_accounts).toBe(false);
  });

  it('once people sign in through a connection, only an owner may change what it trusts: an admin’s new secret or certificate is refused (403)', async () => {
    const c = await connect(ownerBy, 'In use');
    upstreamAccount('user1', `user1@${domain}`);
    expect((await through(c.id, 'user1')).headers.location).toBe('/dashboard');
    await expect(updateConnection(db(), world.settings, organizationId, c.id, { client_secret: c.client_secret }, adminBy)).rejects.toThrow(ForbiddenError);
    await expect(updateConnection(db(), world.settings, organizationId, c.id, { issuer: 'https://elsewhere.example' }, adminBy)).rejects.toThrow(ForbiddenError);
    // The rest stays the admin's; the owner may re-point it.
    expect((await updateConnection(db(), world.settings, organizationId, c.id, { name: 'In use (renamed)' }, adminBy)).name).toBe('In use (renamed)');
    expect((await updateConnection(db(), world.settings, organizationId, c.id, { client_secret: c.client_secret }, ownerBy)).links_existing_accounts).toBe(true);
  });
});

describe(`(5) SSO required, decided by the account's own address on ${BACKEND}`, () => {
  it('a password sign-in typed as alice@bİzreq.example (which lower() finds as alice@bizreq.example) is refused (403) where bizreq.example requires SSO', async (ctx) => {
    if (!foldsDottedI) return ctx.skip('this database’s lower() does not fold İ to i: the typed look-alike finds no account');
    await ssoOrganization(world, { domain: 'bizreq.example', name: 'Bizreq Corp', ssoRequired: true });
    await createUser(db(), { email: 'alice@bizreq.example', password: PASSWORD, name: 'Alice' });
    const typed = 'alice@bİzreq.example';
    const browser = newBrowser();
    // The typed domain routes nowhere (it is xn--...): the email step goes on to the password...
    const step = await postEmail(browser, typed);
    expect(step.statusCode).toBe(200);
    expect(step.body).toContain('name="password"');
    // ...but the account it finds is at bizreq.example.
    const csrf_token = await browser.csrf('/login?method=password');
    const res = await browser.post('/login', { csrf_token, email: typed, password: PASSWORD, return_to: '/dashboard' });
    expect(res.statusCode, res.body.slice(0, 300)).toBe(403);
    expect(res.body).toContain(`<p class="error" role="alert">${SSO_REQUIRED}</p>`);
    expect(browser.cookies.has('orgauth_session')).toBe(false);
    const alice = (await userByEmail('alice@bizreq.example'))!;
    expect(await sessionsOf(alice.id)).toEqual([]);
  });
});

describe(`(6) no password account at an SSO-required domain on ${BACKEND}`, () => {
  let required: SsoOrganization;
  beforeAll(async () => {
    required = await ssoOrganization(world, { domain: 'nosignup.example', name: 'No Signup Corp', ssoRequired: true });
    await ssoOrganization(world, { domain: 'optional.example', name: 'Optional Corp' });
  });

  async function signUp(email: string) {
    const browser = newBrowser();
    const csrf_token = await browser.csrf('/signup');
    return browser.post('/signup', { csrf_token, email, password: PASSWORD, name: 'New Person', organization_name: 'Their Org' });
  }

  it('POST /signup with such an address: 400, pointing at the company sign-in; nobody made', async () => {
    const res = await signUp('newbie@nosignup.example');
    expect(res.statusCode, res.body.slice(0, 300)).toBe(400);
    expect(pageText(res.body)).toContain('Your organization signs you in through its identity provider. On the sign-in page, enter your email and choose Continue to sign in with your company account.');
    expect(res.cookies.find((c) => c.name === 'orgauth_session' && c.value !== '')).toBeUndefined();
    expect(await userByEmail('newbie@nosignup.example')).toBeUndefined();
    expect(await db().selectFrom('pending_sign_ups').select('id').where('email', '=', 'newbie@nosignup.example').execute()).toEqual([]);
    // A verified domain that does not require SSO: signing up works (the account comes with the mailed link).
    const optional = await signUp('someone@optional.example');
    expect(optional.statusCode, optional.body.slice(0, 300)).toBe(200);
    expect(await db().selectFrom('pending_sign_ups').select('email').where('email', '=', 'someone@optional.example').execute()).toEqual([{ email: 'someone@optional.example' }]);
    expect((await mailTo('someone@optional.example', 1)).map((m) => m.subject)).toEqual(['Finish creating your account']);
  });

  it('POST /invitation/signup for an invited address at such a domain: 403; the invitation stays open, for a sign-in through the company', async () => {
    const email = 'invitee@nosignup.example';
    const token = await invite(required, email);
    const invitee = newBrowser();
    const page = await invitee.get(`/invitation?token=${token}`);
    expect(page.statusCode).toBe(200);
    const res = await invitee.post('/invitation/signup', { csrf_token: csrfTokenIn(page.body), token, name: 'Invited', password: PASSWORD });
    expect(res.statusCode, res.body.slice(0, 300)).toBe(403);
    expect(pageText(res.body)).toContain('Your organization signs you in through its identity provider: sign in with your company account first');
    expect(invitee.cookies.has('orgauth_session')).toBe(false);
    expect(await userByEmail(email)).toBeUndefined();
    const invitation = await db().selectFrom('invitations').select(['accepted_at', 'revoked_at']).where('email', '=', email).executeTakeFirstOrThrow();
    expect(invitation).toEqual({ accepted_at: null, revoked_at: null });
    // The link still opens.
    expect((await newBrowser().get(`/invitation?token=${token}`)).statusCode).toBe(200);
  });
});

describe(`(7) just-in-time provisioning never adds back someone the organization removed, on ${BACKEND}`, () => {
  let org: SsoOrganization;
  beforeAll(async () => {
    org = await ssoOrganization(world, { domain: 'removed.example', name: 'Removed Corp', connections: 2 });
  });

  async function through(connectionId: number, login: string): Promise<LightMyRequestResponse> {
    const browser = newBrowser();
    return browser.get(await upstreamCallback(world, await startAt(browser, connectionId), login));
  }

  it('removed after signing in through one connection: refused through the second one too, until an admin adds them back', async () => {
    upstreamAccount('rex', 'rex@removed.example');
    expect((await through(org.connectionIds[0]!, 'rex')).headers.location).toBe('/dashboard');
    const rex = (await userByEmail('rex@removed.example'))!;
    await removeMember(db(), { organizationId: org.organizationId, userId: rex.id });
    expect(await removal(org.organizationId, rex.id)).toBeDefined();

    expectRefusal(await through(org.connectionIds[0]!, 'rex'), 'not_a_member');
    // The second connection has no link for rex: it finds the account by its email, and must not make rex a member again.
    expectRefusal(await through(org.connectionIds[1]!, 'rex'), 'not_a_member');
    expect(await membership(org.organizationId, rex.id)).toBeUndefined();
    expect((await identitiesOf(rex.id)).map((i) => i.connection_id)).toEqual([org.connectionIds[0]]);

    // An admin adds rex back by hand: SSO works again, through both.
    await addMember(db(), { organizationId: org.organizationId, userId: rex.id, role: 'member' });
    expect(await removal(org.organizationId, rex.id)).toBeUndefined();
    expect((await through(org.connectionIds[1]!, 'rex')).headers.location).toBe('/dashboard');
    expect((await identitiesOf(rex.id)).map((i) => i.connection_id)).toEqual(org.connectionIds);
  });

  it('removed before ever using SSO: not re-added by it; an invitation accepted afterwards lets them back, and SSO works again', async () => {
    const rue = await createUser(db(), { email: 'rue@removed.example', password: PASSWORD, name: 'Rue' });
    await addMember(db(), { organizationId: org.organizationId, userId: rue.id, role: 'member' });
    await removeMember(db(), { organizationId: org.organizationId, userId: rue.id });
    upstreamAccount('rue', 'rue@removed.example');

    expectRefusal(await through(org.connectionIds[0]!, 'rue'), 'not_a_member');
    expect(await membership(org.organizationId, rue.id)).toBeUndefined();
    expect(await identitiesOf(rue.id)).toEqual([]);
    expect((await auditEvents(world, org.organizationId, 'sso.sign_in_refused')).map((e) => e.details)).toContainEqual({
      connection_id: org.connectionIds[0], reason: 'not_a_member', subject: 'rue-sub', email: 'rue@removed.example',
    });

    // Invited, and accepted signed in with the password: the organization wants rue back.
    const token = await invite(org, 'rue@removed.example');
    const browser = newBrowser();
    expect((await browser.login('rue@removed.example', PASSWORD)).statusCode).toBe(303);
    const page = await browser.get(`/invitation?token=${token}`);
    expect(page.statusCode).toBe(200);
    const accepted = await browser.post('/invitation/accept', { csrf_token: csrfTokenIn(page.body), token });
    expect(accepted.statusCode, accepted.body.slice(0, 300)).toBe(303);
    expect(await membership(org.organizationId, rue.id)).toEqual({ role: 'member' });
    expect(await removal(org.organizationId, rue.id)).toBeUndefined();

    const res = await through(org.connectionIds[0]!, 'rue');
    expect(res.statusCode, res.body.slice(0, 300)).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    expect((await identitiesOf(rue.id)).map((i) => i.connection_id)).toEqual([org.connectionIds[0]]);
  });
});

describe(`(8) the proof /sso/link asks for is a sign-in made after the link was parked, on ${BACKEND}`, () => {
  it('a browser signed in to the account from before is asked to sign in again; POST /sso/link is 403 until it does', async () => {
    // An unverified domain: the provider's word is not enough, the account's owner proves it.
    const org = await ssoOrganization(world, { domain: 'stale.example', verify: false, name: 'Stale Corp' });
    const olga = await createUser(db(), { email: 'olga@stale.example', password: PASSWORD, name: 'Olga' });
    upstreamAccount('olga', 'olga@stale.example');
    const browser = newBrowser();
    expect((await browser.login('olga@stale.example', PASSWORD)).statusCode).toBe(303);
    // Signed in a while ago (someone else may since have brought this browser to the link page).
    await db().updateTable('sessions').set({ created_at: new Date(Date.now() - 5 * 60_000) }).where('user_id', '=', olga.id).execute();

    // Signed in, the browser leaves for the provider from the sign-in page asked for again (prompt=login).
    const loginPage = await browser.get('/login?prompt=login');
    expect(loginPage.statusCode).toBe(200);
    const leaving = await browser.post(`/sso/${org.connectionId}/start`, { csrf_token: csrfTokenIn(loginPage.body), return_to: '/dashboard' });
    const parked = await browser.get(await upstreamCallback(world, leaving, 'olga'));
    const linkPath = String(parked.headers.location);
    expect(linkPath).toMatch(/^\/sso\/link\?handle=[A-Za-z0-9_-]{43}$/);
    const handle = new URL(linkPath, world.issuer).searchParams.get('handle')!;

    const ask = await browser.get(linkPath);
    expect(ask.statusCode).toBe(200);
    expect(mainText(ask)).toContain('You are signed in to it, but connecting needs a sign-in made for this: sign in once more.');
    expect(ask.body).not.toContain('name="handle"');
    const href = unescapeHtml(/<a class="button" href="([^"]+)">/.exec(ask.body)![1]!);
    expect(new URL(href, world.issuer).searchParams.get('prompt')).toBe('login');

    // The confirmation posted all the same, with the session's own CSRF token: refused, nothing linked, the link still waiting.
    const csrf_token = csrfTokenIn((await browser.get('/dashboard/account')).body);
    const early = await browser.post('/sso/link', { csrf_token, handle });
    expect(early.statusCode, early.body.slice(0, 300)).toBe(403);
    expect(mainText(early)).toContain('Sign in to the account again to connect it: a sign-in from before is not proof.');
    expect(await identitiesOf(olga.id)).toEqual([]);

    // A fresh sign-in, from the page's link: then the confirmation, and the link.
    const login = await browser.get(href);
    expect(login.statusCode).toBe(200);
    const fields = hiddenFields(login.body);
    expect(fields.return_to).toBe(linkPath);
    const fresh = await browser.post('/login', { csrf_token: fields.csrf_token!, return_to: fields.return_to!, email: 'olga@stale.example', password: PASSWORD });
    expect(fresh.statusCode, fresh.body.slice(0, 300)).toBe(303);
    expect(fresh.headers.location).toBe(linkPath);
    const confirm = await browser.get(linkPath);
    expect(confirm.statusCode).toBe(200);
    expect(hiddenFields(confirm.body).handle).toBe(handle);
    const linked = await browser.post('/sso/link', { csrf_token: csrfTokenIn(confirm.body), handle });
    expect(linked.statusCode, linked.body.slice(0, 300)).toBe(303);
    expect(linked.headers.location).toBe('/dashboard');
    expect(await identitiesOf(olga.id)).toEqual([{ connection_id: org.connectionId, subject: 'olga-sub', email: 'olga@stale.example' }]);
  });
});
