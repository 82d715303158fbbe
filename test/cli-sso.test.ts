/**
 * `orgauth domain ...` and `orgauth sso ...` (issue 25): an operator claims and verifies an
 * organization's email domains (the TXT record looked up for real, on a loopback DNS server named
 * by DNS_SERVERS) and connects its OpenID Connect and SAML identity providers, certificates and
 * metadata read from files. Run in-process like test/cli.test.ts, on the backend TEST_DATABASE_URL
 * selects.
 */
import { createHash, X509Certificate } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, runCommandLine, withAbsoluteFiles } from '../src/cli/index.js';
import { loadConfig } from '../src/config.js';
import { openText } from '../src/lib/crypto.js';
import { CLIENT_SECRET_PURPOSE } from '../src/sso/connections.js';
import { TEST_SECRET_KEY, testConfig } from './helpers/app.js';
import { BACKEND, createEmptyDatabase, type TestDatabase } from './helpers/db.js';
import { startDnsServer, type TestDnsServer } from './helpers/dns-server.js';
import { finishJobs } from './helpers/jobs.js';
import { certificateBody, createSamlIdp, generateTestKeyPair, idpKeyPair } from './helpers/saml-idp.js';
import { sharedDatabase } from './helpers/shared-database.js';

let database: TestDatabase;
let dns: TestDnsServer;
let files: string;
let issuer: string;
let orgId: string;

const file = (name: string, content: string | Buffer) => {
  const at = path.join(files, name);
  writeFileSync(at, content);
  return at;
};

beforeAll(async () => {
  database = await createEmptyDatabase({ onDisk: true });
  dns = await startDnsServer();
  files = mkdtempSync(path.join(tmpdir(), 'orgauth-cli-sso-'));
  issuer = testConfig(database.env).issuer;
  expect((await cli('migrate')).code).toBe(0);
  // Set up in process: the user and org commands are test/cli.test.ts's.
  expect((await inProcess('user', 'create', '--email', 'owner@sso-cli.example', '--password', 'a-long-password')).code).toBe(0);
  orgId = String(JSON.parse((await inProcess('org', 'create', '--name', 'SSO Corp', '--owner', 'owner@sso-cli.example', '--json')).stdout).id);

  // The first command migrates an embedded database on disk: slow on a busy machine.
}, 180_000);
afterAll(async () => {
  await closeShared();
  await dns?.close();
  await database?.drop();
  if (files) rmSync(files, { recursive: true, force: true });
});

/**
 * The database the commands after the first of their family run on, opened once (the embedded
 * database on disk takes a second or more to open, and one command opens it only while no other
 * process holds it): closed before a command runs through runCli there.
 */
const { db: sharedDb, close: closeShared } = sharedDatabase(() => cliEnv());
/** The families (`domain`, `sso`, ...) a command has run through runCli. */
const ranThroughRunCli = new Set<string>();

const cliEnv = () => ({ ...database.env, LOG_LEVEL: 'silent', DNS_SERVERS: dns.address });

/**
 * Runs a command as `orgauth` does. The first of each family (and every `migrate`) goes through
 * runCli, which loads the configuration and opens and migrates the database itself, as the
 * binary does; the others run in process.
 */
async function cli(...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const family = argv.find((a) => !a.startsWith('-')) ?? argv[0] ?? '';
  if (family !== 'migrate' && ranThroughRunCli.has(family)) return inProcess(...argv);
  ranThroughRunCli.add(family);
  // The embedded database is held by one process at a time: the shared one is closed first,
  // unless for help, answered before any database is opened.
  if (BACKEND === 'pglite' && !argv.includes('--help')) await closeShared();
  let stdout = '';
  let stderr = '';
  const code = await runCli(argv, { stdout: (s) => (stdout += s), stderr: (s) => (stderr += s), env: cliEnv() });
  return { code, stdout, stderr };
}

/**
 * Runs a command on the shared database with runCommandLine (the parsing and command runCli
 * runs, and the server runs for its admin socket), then finishes the jobs it queued, as runCli does.
 */
async function inProcess(...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const db = await sharedDb();
  const outcome = await runCommandLine(argv, { db, config: loadConfig(cliEnv()), applied: [] });
  await finishJobs(db);
  return outcome;
}

/** Runs a --json command and returns its one object, failing on anything else. */
async function json(...argv: string[]): Promise<Record<string, any>> {
  const result = await cli(...argv, '--json');
  expect(result, result.stderr).toMatchObject({ code: 0, stderr: '' });
  expect(result.stdout.trim().split('\n')).toHaveLength(1);
  return JSON.parse(result.stdout) as Record<string, any>;
}

/** Runs a --json command that must fail; returns its error object from stderr. */
async function jsonError(...argv: string[]): Promise<{ error: string; error_description: string }> {
  const result = await cli(...argv, '--json');
  expect(result, result.stdout).toMatchObject({ code: 1, stdout: '' });
  return JSON.parse(result.stderr) as { error: string; error_description: string };
}

async function auditActions(): Promise<{ action: string; actor_user_id: number | null; actor_client_id: string | null; details: unknown }[]> {
  return (await sharedDb()).selectFrom('audit_events').select(['action', 'actor_user_id', 'actor_client_id', 'details']).where('organization_id', '=', Number(orgId)).orderBy('id').execute();
}

// A command through runCli opens the embedded database on disk (a second or two each on a busy
// machine, and as long again to open the shared one after it): more time than the default 30 s.
describe(`orgauth domain on ${BACKEND}`, { timeout: 180_000 }, () => {
  const domain = 'sso-cli.example';
  const challenge = `_orgauth-challenge.${domain}`;
  let token: string;

  it('domain add prints the domain and the TXT record to publish (--json: the domain with its verification)', async () => {
    const added = await json('domain', 'add', '--org', orgId, '--domain', 'SSO-CLI.example');
    expect(added).toEqual({
      id: expect.any(Number), domain, state: 'pending', sso_required: false,
      verification: { type: 'TXT', name: challenge, value: expect.stringMatching(/^orgauth-domain-verification=\S+$/) },
      verified_at: null, checked_at: null, created_at: expect.any(String),
    });
    token = added.verification.value;
    const plain = await cli('domain', 'add', '--org', orgId, '--domain', 'second.sso-cli.example');
    expect(plain.code, plain.stderr).toBe(0);
    expect(plain.stdout).toMatch(/^claimed second\.sso-cli\.example for organization \d+ \(pending\)\n/);
    expect(plain.stdout).toMatch(/_orgauth-challenge\.second\.sso-cli\.example {2}TXT {2}"orgauth-domain-verification=\S+"\n$/);
    expect(plain.stdout).toContain(`orgauth domain verify --org ${orgId} --domain second.sso-cli.example`);
  });

  it('domain add refuses public mail services, what is not a domain, a claim made twice and an unknown organization', async () => {
    expect(await jsonError('domain', 'add', '--org', orgId, '--domain', 'gmail.com')).toEqual({
      error: 'invalid_request', error_description: 'domain: gmail.com is a public mail service; its addresses belong to their users, not to an organization',
    });
    expect(await jsonError('domain', 'add', '--org', orgId, '--domain', 'not a domain')).toEqual({ error: 'invalid_request', error_description: 'domain: must be a domain name such as example.com' });
    expect((await jsonError('domain', 'add', '--org', orgId, '--domain', domain)).error).toBe('conflict');
    expect(await jsonError('domain', 'add', '--org', '999999', '--domain', 'x.example')).toEqual({ error: 'not_found', error_description: 'organization 999999 not found' });
    expect((await jsonError('domain', 'add', '--org', orgId)).error_description).toMatch(/^--domain is required\nusage: orgauth domain add/);
  });

  it('domain verify looks the TXT record up (DNS_SERVERS): a clear error until it holds the token, then verified', async () => {
    expect(await jsonError('domain', 'verify', '--org', orgId, '--domain', domain)).toEqual({
      error: 'invalid_request', error_description: `no TXT record found at ${challenge}; publish one holding ${token} (DNS changes can take a few minutes)`,
    });
    dns.setTxt(challenge, ['orgauth-domain-verification=not-this-one']);
    const plain = await cli('domain', 'verify', '--org', orgId, '--domain', domain);
    expect(plain).toEqual({ code: 1, stdout: '', stderr: `orgauth: the TXT records at ${challenge} do not hold this domain's token ${token}\n` });
    dns.setTxt(challenge, ['v=spf1 -all', token]);
    expect(await json('domain', 'verify', '--org', orgId, '--domain', domain)).toMatchObject({ domain, state: 'verified', verified_at: expect.any(String) });
    expect(dns.queries()).toContain(challenge);
    expect(await cli('domain', 'verify', '--org', orgId, '--domain', domain)).toEqual({ code: 0, stdout: `${domain} is verified\n`, stderr: '' });
    expect((await jsonError('domain', 'verify', '--org', orgId, '--domain', 'unclaimed.example')).error).toBe('not_found');
  });

  it('domain update --sso-required yes|no; anything else is a usage error', async () => {
    expect(await json('domain', 'update', '--org', orgId, '--domain', domain, '--sso-required', 'yes')).toMatchObject({ domain, sso_required: true });
    expect(await cli('domain', 'update', '--org', orgId, '--domain', domain, '--sso-required', 'no')).toEqual({ code: 0, stdout: `${domain}: SSO not required\n`, stderr: '' });
    expect((await jsonError('domain', 'update', '--org', orgId, '--domain', domain, '--sso-required', 'maybe')).error_description).toMatch(/^--sso-required must be yes or no\nusage: orgauth domain update/);
    expect((await jsonError('domain', 'update', '--org', orgId, '--domain', domain)).error_description).toMatch(/^--sso-required is required\n/);
    const failed = await cli('domain', 'update', '--org', orgId, '--domain', domain, '--sso-required', 'true');
    expect(failed.code).toBe(1);
    expect(failed.stderr).toMatch(/^orgauth: --sso-required must be yes or no\n/);
  });

  it('domain list and show; domain delete, then it is gone', async () => {
    const listed = await json('domain', 'list', '--org', orgId);
    expect(listed.data.map((d: { domain: string; state: string }) => [d.domain, d.state])).toEqual([['second.sso-cli.example', 'pending'], [domain, 'verified']]);
    const table = (await cli('domain', 'list', '--org', orgId)).stdout;
    expect(table).toMatch(/^DOMAIN\s+STATE\s+SSO_REQUIRED\s+TXT RECORD\n/);
    expect(table).toMatch(new RegExp(`^${domain.replace(/\./g, '\\.')}\\s+verified\\s+no\\s+${challenge.replace(/\./g, '\\.')} "${token}"$`, 'm'));
    expect(await json('domain', 'show', '--org', orgId, '--domain', domain)).toEqual(listed.data[1]);
    expect(await json('domain', 'delete', '--org', orgId, '--domain', 'second.sso-cli.example')).toEqual({ organization_id: Number(orgId), domain: 'second.sso-cli.example', deleted: true });
    expect(await jsonError('domain', 'delete', '--org', orgId, '--domain', 'second.sso-cli.example')).toEqual({ error: 'not_found', error_description: 'no such domain in this organization' });
    expect(await cli('domain', 'delete', '--org', orgId, '--domain', domain)).toEqual({ code: 0, stdout: `deleted domain ${domain}\n`, stderr: '' });
    expect(await json('domain', 'list', '--org', orgId)).toEqual({ data: [] });
    expect((await cli('domain', 'list', '--org', orgId)).stdout).toBe('(none)\n');
  });
});

describe(`orgauth sso on ${BACKEND}`, { timeout: 180_000 }, () => {
  const secret = 'cli-upstream-client-secret-0001';
  let oidcId: number;
  let samlId: number;

  it('sso create --protocol oidc prints id and redirect_uri, never the secret; active by default', async () => {
    const plain = await cli('sso', 'create', '--org', orgId, '--protocol', 'oidc', '--name', 'Okta', '--issuer', 'https://acme.okta.example', '--client-id', 'orgauth', '--client-secret', secret);
    expect(plain.code, plain.stderr).toBe(0);
    const id = Number(/^id: +(\d+)$/m.exec(plain.stdout)?.[1]);
    expect(plain.stdout).toBe(
      `created OIDC connection "Okta" in organization ${orgId} (active)\nid:           ${id}\nredirect_uri: ${issuer}/sso/${id}/oidc/callback   (register it at the provider)\n`,
    );

    const made = await json('sso', 'create', '--org', orgId, '--protocol', 'oidc', '--name', 'Entra', '--issuer', 'https://login.entra.example/v2.0', '--client-id', 'orgauth-2', '--client-secret', secret,
      '--scopes', 'openid email', '--jit', 'no', '--default-role', 'viewer', '--state', 'draft');
    expect(made).toEqual({
      id: expect.any(Number), organization_id: Number(orgId), protocol: 'oidc', name: 'Entra', state: 'draft', jit: false, default_role: 'viewer',
      // The operator vouches for what the connection trusts: it links existing accounts by their verified email.
      links_existing_accounts: true,
      created_at: expect.any(String), updated_at: expect.any(String),
      issuer: 'https://login.entra.example/v2.0', client_id: 'orgauth-2', scopes: 'openid email', redirect_uri: `${issuer}/sso/${made.id}/oidc/callback`,
    });
    oidcId = made.id;
    expect(JSON.stringify(made)).not.toContain(secret);
  });

  it('sso create --protocol saml takes repeated --idp-cert-file (PEM, a bundle, DER), prints id, entity_id, acs_url and metadata_url', async () => {
    const current = idpKeyPair().certificatePem;
    const next = generateTestKeyPair('next CLI IdP key').certificatePem;
    const made = await json('sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'ADFS', '--idp-entity-id', 'https://adfs.example/entity', '--idp-sso-url', 'https://adfs.example/sso',
      '--idp-cert-file', file('current.pem', current), '--idp-cert-file', file('next.pem', next), '--idp-initiated', 'yes');
    const base = `${issuer}/sso/${made.id}`;
    expect(made).toEqual({
      id: expect.any(Number), organization_id: Number(orgId), protocol: 'saml', name: 'ADFS', state: 'active', jit: true, default_role: 'member', links_existing_accounts: true,
      created_at: expect.any(String), updated_at: expect.any(String),
      idp_entity_id: 'https://adfs.example/entity', idp_sso_url: 'https://adfs.example/sso', idp_initiated: true,
      idp_certificates: [current, next].map((pem) => ({ subject: expect.any(String), fingerprint_sha256: new X509Certificate(pem).fingerprint256, not_after: expect.any(String) })),
      entity_id: `${base}/saml/metadata`, acs_url: `${base}/saml/acs`, metadata_url: `${base}/saml/metadata`,
    });
    samlId = made.id;

    // One file holding both (a bundle), and a binary DER file, are the same certificates.
    const bundle = await json('sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'Bundle', '--idp-entity-id', 'https://b.example/e', '--idp-sso-url', 'https://b.example/sso',
      '--idp-cert-file', file('bundle.pem', `${current}\n${next}`));
    expect(bundle.idp_certificates).toEqual(made.idp_certificates);
    const der = await json('sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'DER', '--idp-entity-id', 'https://d.example/e', '--idp-sso-url', 'https://d.example/sso',
      '--idp-cert-file', file('current.der', Buffer.from(certificateBody(current), 'base64')), '--idp-cert-file', file('next.b64', certificateBody(next)));
    expect(der.idp_certificates).toEqual(made.idp_certificates);

    const plain = await cli('sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'Plain', '--idp-entity-id', 'https://p.example/e', '--idp-sso-url', 'https://p.example/sso', '--idp-cert-file', path.join(files, 'current.pem'), '--state', 'draft');
    expect(plain.code, plain.stderr).toBe(0);
    const id = Number(/^id: +(\d+)$/m.exec(plain.stdout)?.[1]);
    expect(plain.stdout).toBe(
      [
        `created SAML connection "Plain" in organization ${orgId} (draft)`,
        `id:           ${id}`,
        `entity_id:    ${issuer}/sso/${id}/saml/metadata`,
        `acs_url:      ${issuer}/sso/${id}/saml/acs`,
        `metadata_url: ${issuer}/sso/${id}/saml/metadata   (most IdPs import it)`,
        '',
      ].join('\n'),
    );
  });

  it('sso create --protocol saml --idp-metadata-file reads the IdP from its metadata', async () => {
    const idp = createSamlIdp({ entityId: 'https://okta.example/exk1', ssoUrl: 'https://okta.example/app/sso/saml' });
    const made = await json('sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'Okta SAML', '--idp-metadata-file', file('idp-metadata.xml', idp.metadataXml()));
    expect(made).toMatchObject({
      idp_entity_id: 'https://okta.example/exk1', idp_sso_url: 'https://okta.example/app/sso/saml',
      idp_certificates: [{ fingerprint_sha256: new X509Certificate(idp.certificatePem).fingerprint256 }],
    });
    expect((await jsonError('sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'Bad', '--idp-metadata-file', file('bad.xml', '<html/>'))).error_description).toBe(
      'idp_metadata_xml: must be one EntityDescriptor',
    );
  });

  it('sso create refuses bad input with a clear message and a non-zero exit', async () => {
    const oidc = ['sso', 'create', '--org', orgId, '--protocol', 'oidc', '--name', 'X', '--issuer', 'https://x.example', '--client-id', 'x', '--client-secret', 's'];
    const usage = async (argv: string[], message: string) => {
      const error = await jsonError(...argv);
      expect(error.error).toBe('usage');
      expect(error.error_description.split('\n')[0]).toBe(message);
      expect(error.error_description).toMatch(/\nusage: orgauth sso create/);
    };
    await usage(['sso', 'create', '--org', orgId, '--protocol', 'ldap', '--name', 'X'], '--protocol must be oidc or saml');
    await usage(['sso', 'create', '--org', orgId, '--name', 'X'], '--protocol is required');
    await usage(['sso', 'create', '--org', orgId, '--protocol', 'oidc', '--name', 'X', '--client-id', 'x', '--client-secret', 's'], '--issuer is required for an OIDC connection');
    await usage(['sso', 'create', '--org', orgId, '--protocol', 'oidc', '--name', 'X', '--issuer', 'https://x.example', '--client-id', 'x'], '--client-secret is required for an OIDC connection');
    await usage([...oidc, '--jit', 'maybe'], '--jit must be yes or no');
    await usage([...oidc, '--state', 'paused'], '--state must be draft, active or disabled');
    await usage([...oidc, '--idp-sso-url', 'https://x.example/sso'], '--idp-sso-url: not for an OIDC connection');
    await usage(['sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'X', '--idp-entity-id', 'e', '--idp-sso-url', 'https://x.example/sso'], '--idp-cert-file is required for a SAML connection (or --idp-metadata-file)');
    await usage(['sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'X', '--client-id', 'x', '--idp-metadata-file', 'x.xml'], '--client-id: not for a SAML connection');
    await usage(['sso', 'create', '--org', orgId, '--protocol', 'oidc', '--issuer', 'https://x.example', '--client-id', 'x', '--client-secret', 's'], '--name is required');

    expect(await jsonError(...oidc.slice(0, 8), '--issuer', 'ftp://x.example', ...oidc.slice(10))).toEqual({
      error: 'invalid_request', error_description: 'issuer: must be an http(s) URL without credentials or fragment',
    });
    expect((await jsonError(...oidc, '--default-role', 'owner')).error_description).toBe('default_role: a connection cannot make owners');
    expect((await jsonError(...oidc, '--default-role', 'Wizard')).error).toBe('invalid_request');
    expect(await jsonError(...oidc.map((a) => (a === orgId ? '999999' : a)))).toEqual({ error: 'not_found', error_description: 'organization 999999 not found' });
    const missing = path.join(files, 'missing.pem');
    expect(await jsonError('sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'X', '--idp-entity-id', 'e', '--idp-sso-url', 'https://x.example/sso', '--idp-cert-file', missing)).toEqual({
      error: 'invalid_request', error_description: `--idp-cert-file ${missing}: cannot be read (ENOENT)`,
    });
    expect(await jsonError('sso', 'create', '--org', orgId, '--protocol', 'saml', '--name', 'X', '--idp-entity-id', 'e', '--idp-sso-url', 'https://x.example/sso', '--idp-cert-file', file('junk.pem', 'not a certificate'))).toEqual({
      error: 'invalid_request', error_description: 'idp_certificates.0: is not an X.509 certificate (PEM or base64 DER)',
    });
    const plain = await cli('sso', 'create', '--org', orgId, '--protocol', 'kerberos', '--name', 'X');
    expect(plain.code).toBe(1);
    expect(plain.stdout).toBe('');
    expect(plain.stderr).toMatch(/^orgauth: --protocol must be oidc or saml\nusage: orgauth sso create/);
  });

  it('sso list and show; never a secret', async () => {
    const listed = await json('sso', 'list', '--org', orgId);
    expect(listed.data.map((c: { id: number }) => c.id)).toEqual(expect.arrayContaining([oidcId, samlId]));
    expect(JSON.stringify(listed)).not.toContain(secret);
    expect(await json('sso', 'show', '--org', orgId, '--id', String(oidcId))).toEqual(listed.data.find((c: { id: number }) => c.id === oidcId));
    const table = (await cli('sso', 'list', '--org', orgId)).stdout;
    expect(table).toMatch(/^ID\s+PROTOCOL\s+NAME\s+STATE\s+JIT\s+DEFAULT_ROLE\s+IDP\n/);
    expect(table).toMatch(new RegExp(`^${samlId}\\s+saml\\s+ADFS\\s+active\\s+yes\\s+member\\s+https://adfs.example/entity$`, 'm'));
    const shown = (await cli('sso', 'show', '--org', orgId, '--id', String(samlId))).stdout;
    expect(shown).toContain(`acs_url:      ${issuer}/sso/${samlId}/saml/acs`);
    expect(shown.match(/^certificate: /gm)).toHaveLength(2);
    expect(shown).toMatch(/^link_existing: yes /m);
    expect(await jsonError('sso', 'show', '--org', orgId, '--id', '987654')).toEqual({ error: 'not_found', error_description: 'no such SSO connection in this organization' });
    expect((await jsonError('sso', 'show', '--org', orgId, '--id', '01')).error_description).toMatch(/^--id must be a positive integer\n/);
  });

  it('sso update changes what it is given: state, name, jit, default role, the certificates (replaced whole)', async () => {
    expect(await json('sso', 'update', '--org', orgId, '--id', String(oidcId), '--state', 'active', '--name', 'Entra ID', '--jit', 'yes', '--default-role', 'member')).toMatchObject({
      id: oidcId, state: 'active', name: 'Entra ID', jit: true, default_role: 'member', scopes: 'openid email',
    });
    expect(await cli('sso', 'update', '--org', orgId, '--id', String(oidcId), '--state', 'disabled')).toEqual({ code: 0, stdout: `updated OIDC connection ${oidcId} "Entra ID" (disabled)\n`, stderr: '' });
    const newer = generateTestKeyPair('newer CLI IdP key').certificatePem;
    const rotated = await json('sso', 'update', '--org', orgId, '--id', String(samlId), '--idp-cert-file', file('newer.pem', newer), '--idp-initiated', 'no');
    expect(rotated).toMatchObject({ idp_initiated: false, idp_certificates: [{ fingerprint_sha256: new X509Certificate(newer).fingerprint256 }] });
    expect(rotated.idp_certificates).toHaveLength(1);
    // With --issuer (unchanged): see the known bug noted in test/api/sso-management.test.ts, where
    // the domain layer applies OIDC fields only when the issuer is among them.
    const secretNow = 'cli-rotated-client-secret-0002';
    const updated = await cli('sso', 'update', '--org', orgId, '--id', String(oidcId), '--issuer', 'https://login.entra.example/v2.0', '--client-secret', secretNow, '--json');
    expect(updated.code, updated.stderr).toBe(0);
    expect(updated.stdout).not.toContain(secretNow);
    const row = await (await sharedDb()).selectFrom('sso_connections').select('oidc_client_secret_sealed').where('id', '=', oidcId).executeTakeFirstOrThrow();
    expect(openText(TEST_SECRET_KEY, CLIENT_SECRET_PURPOSE, row.oidc_client_secret_sealed!)).toBe(secretNow);

    // --link-existing yes|no: the operator may turn linking existing accounts by their verified email off and on.
    expect(await json('sso', 'update', '--org', orgId, '--id', String(samlId), '--link-existing', 'no')).toMatchObject({ id: samlId, links_existing_accounts: false });
    expect((await cli('sso', 'show', '--org', orgId, '--id', String(samlId))).stdout).toMatch(/^link_existing: no /m);
    expect(await json('sso', 'update', '--org', orgId, '--id', String(samlId), '--link-existing', 'yes')).toMatchObject({ id: samlId, links_existing_accounts: true });
    expect((await jsonError('sso', 'update', '--org', orgId, '--id', String(samlId), '--link-existing', 'maybe')).error_description).toMatch(/^--link-existing must be yes or no\n/);
    const unlinked = await json('sso', 'create', '--org', orgId, '--protocol', 'oidc', '--name', 'Unlinked', '--issuer', 'https://u.example', '--client-id', 'u', '--client-secret', secret, '--link-existing', 'no');
    expect(unlinked.links_existing_accounts).toBe(false);
    expect(await json('sso', 'delete', '--org', orgId, '--id', String(unlinked.id))).toMatchObject({ deleted: true });

    expect((await jsonError('sso', 'update', '--org', orgId, '--id', String(samlId), '--client-secret', 'x')).error_description).toMatch(/^--client-secret: not for a SAML connection\n/);
    expect((await jsonError('sso', 'update', '--org', orgId, '--id', String(oidcId), '--idp-cert-file', 'x.pem')).error_description).toMatch(/^--idp-cert-file: not for an OIDC connection\n/);
    expect((await jsonError('sso', 'update', '--org', orgId, '--id', String(oidcId), '--state', 'on')).error).toBe('usage');
    expect((await jsonError('sso', 'update', '--org', orgId, '--id', String(oidcId), '--default-role', 'owner')).error_description).toBe('default_role: a connection cannot make owners');
  });

  it('sso delete, then it is gone; every change is in the audit log, made by the operator', async () => {
    expect(await json('sso', 'delete', '--org', orgId, '--id', String(oidcId))).toEqual({ id: oidcId, organization_id: Number(orgId), deleted: true });
    expect(await jsonError('sso', 'delete', '--org', orgId, '--id', String(oidcId))).toEqual({ error: 'not_found', error_description: 'no such SSO connection in this organization' });
    expect(await cli('sso', 'delete', '--org', orgId, '--id', String(samlId))).toEqual({ code: 0, stdout: `deleted SSO connection ${samlId} "ADFS"\n`, stderr: '' });
    const events = await auditActions();
    expect(events.map((e) => e.action)).toEqual(
      expect.arrayContaining(['domain.added', 'domain.verification_failed', 'domain.verified', 'domain.updated', 'domain.deleted', 'sso_connection.created', 'sso_connection.updated', 'sso_connection.deleted']),
    );
    expect(events.filter((e) => e.action.startsWith('sso_connection.') || e.action.startsWith('domain.')).every((e) => e.actor_user_id === null && e.actor_client_id === null)).toBe(true);
    expect(JSON.stringify(events)).not.toContain(secret);
  });
});

describe(`orgauth directory on ${BACKEND}`, { timeout: 180_000 }, () => {
  it('creates a SCIM directory (token printed once, kept as its hash), lists, shows, updates, rotates and deletes it; the API\'s JSON with --json', async () => {
    const created = await json('directory', 'create', '--org', orgId, '--name', 'Okta', '--default-role', 'viewer', '--map-group', 'Engineering=member', '--map-group', 'R&D = Labs=admin');
    expect(created).toEqual({
      id: expect.any(Number), name: 'Okta', state: 'active', default_role: 'viewer',
      base_url: expect.stringMatching(new RegExp(`^${issuer.replace(/[.]/g, '\\.')}/scim/v2/\\d+$`)),
      group_roles: [{ group: 'Engineering', role: 'member' }, { group: 'R&D = Labs', role: 'admin' }],
      token: expect.stringMatching(/^scim_[A-Za-z0-9_-]{43}$/), token_created_at: expect.any(String), created_at: expect.any(String), updated_at: expect.any(String),
    });
    const id = String(created.id);
    expect(created.base_url).toBe(`${issuer}/scim/v2/${id}`);
    const row = await (await sharedDb()).selectFrom('directories').select('token_hash').where('id', '=', created.id).executeTakeFirstOrThrow();
    expect(row.token_hash).toBe(createHash('sha256').update(created.token).digest('hex'));

    const { token, ...shown } = created;
    expect(await json('directory', 'show', '--org', orgId, '--id', id)).toEqual(shown);
    expect(await json('directory', 'list', '--org', orgId)).toEqual({ data: [shown] });
    const text = await cli('directory', 'list', '--org', orgId);
    expect(text.stdout).toMatch(new RegExp(`^ID +NAME +STATE +DEFAULT_ROLE +GROUP_ROLES\n${id} +Okta +active +viewer +2\n$`));
    expect(text.stdout + (await cli('directory', 'show', '--org', orgId, '--id', id)).stdout).not.toContain(token);

    expect(await json('directory', 'update', '--org', orgId, '--id', id, '--state', 'disabled', '--map-group', 'Admins=admin')).toMatchObject({ state: 'disabled', default_role: 'viewer', group_roles: [{ group: 'Admins', role: 'admin' }] });
    expect(await json('directory', 'update', '--org', orgId, '--id', id, '--no-group-roles')).toMatchObject({ group_roles: [] });

    const rotated = await json('directory', 'rotate-token', '--org', orgId, '--id', id);
    expect(rotated.token).toMatch(/^scim_/);
    expect(rotated.token).not.toBe(token);
    const rotatedText = await cli('directory', 'rotate-token', '--org', orgId, '--id', id);
    expect(rotatedText.stdout).toMatch(/^rotated the token of directory \d+; the old one no longer works\n[\s\S]*token: +scim_[A-Za-z0-9_-]{43}\n\(the token is shown only now/);

    expect(await cli('directory', 'delete', '--org', orgId, '--id', id)).toEqual({ code: 0, stdout: `deleted directory ${id}\n`, stderr: '' });
    expect(await jsonError('directory', 'show', '--org', orgId, '--id', id)).toEqual({ error: 'not_found', error_description: 'directory not found' });
    const events = (await auditActions()).filter((e) => e.action.startsWith('directory.'));
    expect(events.map((e) => e.action)).toEqual(['directory.created', 'directory.updated', 'directory.updated', 'directory.token_rotated', 'directory.token_rotated', 'directory.deleted']);
    expect(events.every((e) => e.actor_user_id === null && e.actor_client_id === null)).toBe(true);
    expect(JSON.stringify(events)).not.toContain(token);
  });

  it('refuses owner, a malformed --map-group, --map-group with --no-group-roles, and a bad --id, saying which', async () => {
    expect((await jsonError('directory', 'create', '--org', orgId, '--name', 'X', '--default-role', 'owner')).error_description).toMatch(/^default_role: must be one of viewer, member, admin/);
    expect((await jsonError('directory', 'create', '--org', orgId, '--name', 'X', '--map-group', 'Admins=owner')).error_description).toMatch(/group_roles\.0\.role/);
    expect(await jsonError('directory', 'create', '--org', orgId, '--name', 'X', '--map-group', 'Admins')).toEqual({ error: 'usage', error_description: expect.stringMatching(/^--map-group takes "GROUP=ROLE"/) });
    expect(await jsonError('directory', 'update', '--org', orgId, '--id', '1', '--map-group', 'A=member', '--no-group-roles')).toEqual({ error: 'usage', error_description: expect.stringMatching(/exclude each other/) });
    expect(await jsonError('directory', 'show', '--org', orgId, '--id', '01')).toEqual({ error: 'usage', error_description: expect.stringMatching(/^--id must be a positive integer/) });
    expect(await json('directory', 'list', '--org', orgId)).toEqual({ data: [] });
  });
});

describe('the sso and domain commands in the help, and their files beside a running server', () => {
  it('lists every command, with its usage', async () => {
    const help = await cli('--help');
    for (const command of ['sso create', 'sso list', 'sso show', 'sso update', 'sso delete', 'domain add', 'domain list', 'domain show', 'domain verify', 'domain update', 'domain delete',
      'directory create', 'directory list', 'directory show', 'directory update', 'directory rotate-token', 'directory delete']) {
      expect(help.stdout).toContain(`  ${command} `);
    }
    expect((await cli('sso', 'create', '--help')).stdout).toMatch(/^usage: orgauth sso create --org ID --protocol oidc .*\n {7}orgauth sso create --org ID --protocol saml .*--idp-cert-file FILE \[--idp-cert-file FILE2\]\.\.\./);
    expect((await cli('domain', 'verify', '--help')).stdout).toMatch(/^usage: orgauth domain verify --org ID --domain D\n/);
  });

  it('sends file options to the admin socket as absolute paths (the server reads them from its own directory)', () => {
    const here = process.cwd();
    expect(withAbsoluteFiles(['sso', 'create', '--idp-cert-file', 'a.pem', '--idp-cert-file=certs/b.pem', '--idp-metadata-file', '/abs/m.xml', '--name', 'x.pem', '--json'])).toEqual([
      'sso', 'create', '--idp-cert-file', path.join(here, 'a.pem'), `--idp-cert-file=${path.join(here, 'certs/b.pem')}`, '--idp-metadata-file', '/abs/m.xml', '--name', 'x.pem', '--json',
    ]);
    // A missing value stays missing (parseArgs reports it), not the working directory.
    expect(withAbsoluteFiles(['sso', 'create', '--idp-cert-file', '--json'])).toEqual(['sso', 'create', '--idp-cert-file', '--json']);
    expect(withAbsoluteFiles(['sso', 'create', '--idp-cert-file'])).toEqual(['sso', 'create', '--idp-cert-file']);
  });
});
