/**
 * `orgauth org setup-link ...` (issue 43): the operator makes a setup link for an organization
 * (the URL printed once, only its hash stored), lists the live ones and revokes one. Run in
 * process with runCommandLine (the parsing and the commands runCli runs, as test/cli-sso.test.ts
 * does after a family's first command) on the backend TEST_DATABASE_URL selects; what the link
 * opens is test/dashboard/setup-links.test.ts's.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../src/accounts/organizations.js';
import { findLiveSetupLink } from '../src/accounts/setup-links.js';
import { createUser } from '../src/accounts/users.js';
import { runCli, runCommandLine } from '../src/cli/index.js';
import type { DB } from '../src/db/connect.js';
import { sha256Hex } from '../src/lib/crypto.js';
import { testConfig } from './helpers/app.js';
import { jsonCommands } from './helpers/cli-json.js';
import { BACKEND, createTestDatabase } from './helpers/db.js';

let db: DB;
let close: () => Promise<void>;
let orgId: string;
let otherOrgId: string;
const config = testConfig();

beforeAll(async () => {
  const t = await createTestDatabase();
  db = t.handle.db;
  close = t.close;
  const owner = await createUser(db, { email: 'owner@setup-cli.example', password: 'a-long-password' });
  orgId = String((await createOrganization(db, { name: 'Setup Corp', ownerUserId: owner.id })).id);
  otherOrgId = String((await createOrganization(db, { name: 'Other Corp', ownerUserId: owner.id })).id);
});
afterAll(() => close?.());

const cli = (...argv: string[]) => runCommandLine(argv, { db, config, applied: [] });

const { json, jsonError } = jsonCommands(cli);

const tokenOf = (url: string) => url.slice(`${config.issuer}/setup/`.length);

describe(`orgauth org setup-link on ${BACKEND}`, () => {
  let first: Record<string, any>;

  it('makes a link for the features asked (--for, repeated) and prints its URL once, with its id and expiry (--json)', async () => {
    first = await json('org', 'setup-link', '--org', orgId, '--for', 'directory', '--for', 'sso', '--expires', '3d');
    expect(first).toEqual({
      id: expect.any(Number), organization_id: Number(orgId), features: ['sso', 'directory'], created_by: null,
      created_at: expect.any(String), expires_at: expect.any(String), last_used_at: null,
      url: expect.stringMatching(new RegExp(`^${config.issuer}/setup/[A-Za-z0-9_-]{43}$`)),
    });
    expect(Date.parse(first.expires_at) - Date.parse(first.created_at)).toBe(3 * 86_400_000);
    const row = await db.selectFrom('setup_links').selectAll().where('id', '=', first.id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ token_hash: sha256Hex(tokenOf(first.url)), created_by_user_id: null, features: ['sso', 'directory'] });
    expect(JSON.stringify(row)).not.toContain(tokenOf(first.url));
    expect(await findLiveSetupLink(db, tokenOf(first.url))).toMatchObject({ id: first.id, organizationId: Number(orgId), features: ['sso', 'directory'] });
    const audit = await db.selectFrom('audit_events').select(['actor_user_id', 'details']).where('organization_id', '=', Number(orgId)).where('action', '=', 'setup_link.created').execute();
    expect(audit).toEqual([{ actor_user_id: null, details: { setup_link_id: first.id, features: ['sso', 'directory'], expires_at: first.expires_at } }]);
  });

  it('says the URL and how to revoke it in text; a week by default', async () => {
    const plain = await cli('org', 'setup-link', '--org', orgId, '--for', 'domains');
    expect(plain.code, plain.stderr).toBe(0);
    const [summary, url, hint, ...rest] = plain.stdout.split('\n');
    const id = Number(/^setup link (\d+) /.exec(summary ?? '')?.[1]);
    expect(summary).toMatch(new RegExp(`^setup link ${id} for organization ${orgId} "Setup Corp": domains, until \\S+Z$`));
    expect(url).toMatch(new RegExp(`^${config.issuer}/setup/[A-Za-z0-9_-]{43}$`));
    expect(hint).toBe(`(the link is shown only now: send it to the person who sets these up; \`orgauth org setup-link revoke --org ${orgId} --id ${id}\` ends it)`);
    expect(rest).toEqual(['']);
    const row = await db.selectFrom('setup_links').select(['created_at', 'expires_at']).where('id', '=', id).executeTakeFirstOrThrow();
    expect(row.expires_at.getTime() - row.created_at.getTime()).toBe(7 * 86_400_000);
  });

  it('refuses a link with no feature, an unknown feature, a lifetime past 30 days or not one, and an unknown organization', async () => {
    expect((await jsonError('org', 'setup-link', '--org', orgId)).error_description).toMatch(/^--for is required .*\nusage: orgauth org setup-link --org ID --for domains\|sso\|directory/);
    expect(await jsonError('org', 'setup-link', '--org', orgId, '--for', 'members')).toMatchObject({ error: 'invalid_request', error_description: expect.stringContaining('must be among domains, sso, directory') });
    expect(await jsonError('org', 'setup-link', '--org', orgId, '--for', 'sso', '--expires', '31d')).toMatchObject({ error: 'invalid_request', error_description: expect.stringContaining('must be at most 30 days') });
    expect((await jsonError('org', 'setup-link', '--org', orgId, '--for', 'sso', '--expires', '2w')).error_description).toMatch(/^--expires takes a number of days or hours/);
    expect(await jsonError('org', 'setup-link', '--org', '999999', '--for', 'sso')).toEqual({ error: 'not_found', error_description: 'organization 999999 not found' });
  });

  it('setup-link list shows the live links, newest first, never their URLs', async () => {
    const listed = await json('org', 'setup-link', 'list', '--org', orgId);
    expect(listed.data.map((l: { features: string[] }) => l.features)).toEqual([['domains'], ['sso', 'directory']]);
    expect(listed.data[1]).toEqual({ ...first, url: undefined });
    expect(JSON.stringify(listed)).not.toContain(tokenOf(first.url));
    const table = (await cli('org', 'setup-link', 'list', '--org', orgId)).stdout;
    expect(table).toMatch(/^ID\s+FEATURES\s+EXPIRES\s+CREATED BY\s+LAST USED\n/);
    expect(table).toMatch(new RegExp(`^${first.id}\\s+sso,directory\\s+\\S+\\s+\\(operator\\)\\s+never$`, 'm'));
    expect(await json('org', 'setup-link', 'list', '--org', otherOrgId)).toEqual({ data: [] });
    expect((await cli('org', 'setup-link', 'list', '--org', otherOrgId)).stdout).toBe('(none)\n');
  });

  it('setup-link revoke ends a link at once; another organization’s or a revoked one is not found', async () => {
    expect(await jsonError('org', 'setup-link', 'revoke', '--org', otherOrgId, '--id', String(first.id))).toEqual({ error: 'not_found', error_description: 'no such live setup link in this organization' });
    expect(await json('org', 'setup-link', 'revoke', '--org', orgId, '--id', String(first.id))).toEqual({ organization_id: Number(orgId), id: first.id, revoked: true });
    expect(await findLiveSetupLink(db, tokenOf(first.url))).toBeUndefined();
    expect((await json('org', 'setup-link', 'list', '--org', orgId)).data.map((l: { id: number }) => l.id)).not.toContain(first.id);
    expect(await cli('org', 'setup-link', 'revoke', '--org', orgId, '--id', String(first.id))).toEqual({ code: 1, stdout: '', stderr: 'orgauth: no such live setup link in this organization\n' });
    expect((await jsonError('org', 'setup-link', 'revoke', '--org', orgId, '--id', 'x')).error_description).toMatch(/^--id must be a positive integer\nusage: orgauth org setup-link revoke --org ID --id N/);
    const audit = await db.selectFrom('audit_events').select(['actor_user_id', 'details']).where('organization_id', '=', Number(orgId)).where('action', '=', 'setup_link.revoked').execute();
    expect(audit).toEqual([{ actor_user_id: null, details: { setup_link_id: first.id, features: ['sso', 'directory'] } }]);
  });

  it('the three commands are in the help, each with its usage (answered before any database is opened)', async () => {
    let stdout = '';
    expect(await runCli(['--help'], { stdout: (s) => (stdout += s), stderr: () => {}, env: {} })).toBe(0);
    expect(stdout).toMatch(/^ {2}org setup-link +make a link/m);
    expect(stdout).toMatch(/^ {2}org setup-link list +list/m);
    expect(stdout).toMatch(/^ {2}org setup-link revoke +end a setup link/m);
    stdout = '';
    expect(await runCli(['org', 'setup-link', 'revoke', '--help'], { stdout: (s) => (stdout += s), stderr: () => {}, env: {} })).toBe(0);
    expect(stdout).toBe('usage: orgauth org setup-link revoke --org ID --id N\n  end a setup link at once\n');
  });
});
