/**
 * The `orgauth` command: administration from a shell, with the server's configuration.
 * With --json every command prints exactly one JSON object on stdout; errors go to stderr and
 * the exit code is 1. Lists print `{"data": [...], "next_cursor"}`, a page at a time.
 *
 * On PostgreSQL the command connects to the database itself. On the embedded database, which
 * one process opens at a time, it does so when no server runs; while one does, it sends the
 * command line to that server's admin socket (src/admin-socket.ts), which runs it here, in
 * runCommandLine, with the same output and exit code.
 */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { z } from 'zod';
import {
  addMember,
  changeMemberRole,
  createOrganization,
  listMembers,
  listOrganizations,
  organizationIdSchema,
  removeMember,
} from './accounts/organizations.js';
import { createRole, deleteRole, listRoles, requireRole, updateRole } from './accounts/roles.js';
import { createUser, getUserByEmail, listUsers } from './accounts/users.js';
import { sendToAdminSocket, type CommandOutcome } from './admin-socket.js';
import { applicationOut } from './api/applications.js';
import { grantOut } from './api/grants.js';
import { memberOut } from './api/members.js';
import { roleOut } from './api/roles.js';
import { decodeCursor, decodeDescendingCursor, listPage } from './api/pagination.js';
import { ConfigError, loadConfig, type Config } from './config.js';
import type { DB } from './db/connect.js';
import { DatabaseInUseError } from './db/lock.js';
import { formatDemoBanner, seedDemo } from './demo.js';
import { AppError, InvalidRequestError, NotFoundError } from './errors.js';
import { parseInput } from './lib/validate.js';
import { createApplication, deleteApplication, findApplicationByClientId, listApplications, rotateClientSecret, updateApplication } from './oauth/models/applications.js';
import { ClientGrants } from './oauth/models/client-grants.js';
import { UnauthorizedClientError } from './oauth/errors.js';
import { listLiveGrants, revokeGrant } from './oauth/models/grants.js';
import { KeyStore } from './oauth/models/key-store.js';
import { ensureSigningKey, listSigningKeys, rotateSigningKey } from './oauth/models/signing-keys.js';
import { parseCanonicalId } from './oauth/helpers/params.js';
import { grantableScopes } from './oauth/helpers/scopes.js';
import { issueClientToken } from './oauth/grants/token-response.js';
import { deleteExpired } from './retention.js';
import { describeStartupError, openDatabase } from './runtime.js';

type Options = NonNullable<ParseArgsConfig['options']>;
type Values = Record<string, string | boolean | (string | boolean)[] | undefined>;

/** What a command runs with: the database, and the configuration of whoever opened it (this process, or the server). */
export interface CommandContext {
  db: DB;
  config: Config;
  /** Migrations applied while opening the database. */
  applied: string[];
}

interface Command {
  usage: string;
  summary: string;
  options: Options;
  run(ctx: CommandContext, values: Values): Promise<{ json: object; text: string }>;
}

class UsageError extends InvalidRequestError {}

function required(values: Values, name: string): string {
  const value = values[name];
  if (typeof value !== 'string' || value === '') throw new UsageError(`--${name} is required`);
  return value;
}

function optionalString(values: Values, name: string): string | undefined {
  const value = values[name];
  return typeof value === 'string' ? value : undefined;
}

/** A repeatable option (`multiple: true`): every value given, in order. */
function repeated(values: Values, name: string): string[] {
  const value = values[name];
  return Array.isArray(value) ? value.filter((v) => typeof v === 'string') : [];
}

function orgId(values: Values): number {
  return parseInput(organizationIdSchema, required(values, 'org'));
}

const splitList = (value: string) => value.split(/[\s,]+/).filter((p) => p !== '');

/** --role: a built-in role or one of the organization's own, by name. */
const cliRole = (db: DB, organizationId: number, name: string) => requireRole(db, organizationId, name, '--role');

async function applicationByClientId(db: DB, clientId: string) {
  const application = await findApplicationByClientId(db, clientId);
  if (!application) throw new NotFoundError(`no application with client_id ${clientId}`);
  return application;
}

async function memberByEmail(db: DB, values: Values) {
  const organizationId = orgId(values);
  const user = await getUserByEmail(db, required(values, 'email'));
  return { organizationId, user };
}

// Lists: a page at a time, like the API (keyset pagination; --cursor is the previous page's next_cursor).
const PAGE_OPTIONS: Options = { limit: { type: 'string' }, cursor: { type: 'string' } };
const PAGE_USAGE = '[--limit N] [--cursor C]';
const DEFAULT_PAGE = 100;
const MAX_PAGE = 1000;

function pageLimit(values: Values): number {
  const raw = optionalString(values, 'limit');
  if (raw === undefined) return DEFAULT_PAGE;
  const n = /^[1-9][0-9]{0,3}$/.test(raw) ? Number(raw) : NaN;
  if (!(n <= MAX_PAGE)) throw new UsageError(`--limit must be a whole number from 1 to ${MAX_PAGE}`);
  return n;
}

/** One page, shaped as the API answers it, with a text table for people. */
async function listed<R, T extends object>(
  values: Values,
  fetch: (limit: number) => Promise<R[]>,
  keyOf: (row: R) => number,
  out: (row: R) => T,
  columns: [header: string, cell: (row: T) => string][],
): Promise<{ json: object; text: string }> {
  const result = await listPage(pageLimit(values), fetch, keyOf, out);
  const lines = [table(columns.map(([h]) => h), result.data.map((row) => columns.map(([, cell]) => cell(row))))];
  if (result.next_cursor) lines.push(`more: --cursor ${result.next_cursor}`);
  return { json: result, text: result.data.length === 0 ? '(none)' : lines.join('\n') };
}

function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  return [headers, ...rows].map((r) => r.map((cell, i) => cell.padEnd(widths[i]!)).join('  ').trimEnd()).join('\n');
}

const COMMANDS: Record<string, Command> = {
  migrate: {
    usage: 'orgauth migrate',
    summary: 'apply pending database migrations',
    options: {},
    // Opening the database migrates it; a running server migrated it when it started.
    run: async ({ applied }) => ({
      json: { applied },
      text: applied.length > 0 ? `applied ${applied.join(', ')}` : 'the database is up to date',
    }),
  },

  'user create': {
    usage: 'orgauth user create --email E --password P [--name N]',
    summary: 'create a user (password: at least 10 characters); the operator vouches for the address, so it counts as verified',
    options: { email: { type: 'string' }, password: { type: 'string' }, name: { type: 'string' } },
    run: async ({ db }, v) => {
      const user = await createUser(db, {
        email: required(v, 'email'),
        password: required(v, 'password'),
        name: optionalString(v, 'name'),
        emailVerified: true,
      });
      return { json: user, text: `created user ${user.id} <${user.email}>` };
    },
  },

  'user list': {
    usage: `orgauth user list ${PAGE_USAGE}`,
    summary: 'list users, in id order',
    options: PAGE_OPTIONS,
    run: async ({ db }, v) =>
      listed(
        v,
        (limit) => listUsers(db, { afterId: decodeCursor(optionalString(v, 'cursor')), limit }),
        (u) => u.id,
        (u) => ({ id: u.id, email: u.email, name: u.name, created_at: u.created_at.toISOString() }),
        [['ID', (u) => String(u.id)], ['EMAIL', (u) => u.email], ['NAME', (u) => u.name], ['CREATED', (u) => u.created_at]],
      ),
  },

  'org create': {
    usage: 'orgauth org create --name N --owner EMAIL',
    summary: 'create an organization owned by an existing user',
    options: { name: { type: 'string' }, owner: { type: 'string' } },
    run: async ({ db }, v) => {
      const owner = await getUserByEmail(db, required(v, 'owner'));
      const org = await createOrganization(db, { name: required(v, 'name'), ownerUserId: owner.id });
      return { json: org, text: `created organization ${org.id} "${org.name}" owned by ${owner.email}` };
    },
  },

  'org list': {
    usage: `orgauth org list ${PAGE_USAGE}`,
    summary: 'list organizations, in id order',
    options: PAGE_OPTIONS,
    run: async ({ db }, v) =>
      listed(
        v,
        (limit) => listOrganizations(db, { afterId: decodeCursor(optionalString(v, 'cursor')), limit }),
        (o) => o.id,
        (o) => ({ id: o.id, name: o.name, created_at: o.created_at.toISOString() }),
        [['ID', (o) => String(o.id)], ['NAME', (o) => o.name], ['CREATED', (o) => o.created_at]],
      ),
  },

  'member add': {
    usage: 'orgauth member add --org ID --email E [--role owner|admin|member|viewer|<custom role>]',
    summary: 'add an existing user to an organization (role member by default)',
    options: { org: { type: 'string' }, email: { type: 'string' }, role: { type: 'string' } },
    run: async ({ db }, v) => {
      const { organizationId, user } = await memberByEmail(db, v);
      const role = await cliRole(db, organizationId, optionalString(v, 'role') ?? 'member');
      const m = await addMember(db, { organizationId, userId: user.id, role });
      return { json: m, text: `added ${user.email} to organization ${m.organization_id} as ${m.role}` };
    },
  },

  'member list': {
    usage: `orgauth member list --org ID ${PAGE_USAGE}`,
    summary: "list an organization's members, in user id order",
    options: { org: { type: 'string' }, ...PAGE_OPTIONS },
    run: async ({ db }, v) => {
      const organizationId = orgId(v);
      return listed(
        v,
        (limit) => listMembers(db, organizationId, { afterUserId: decodeCursor(optionalString(v, 'cursor')), limit }),
        (m) => m.user_id,
        memberOut,
        [['USER', (m) => String(m.user_id)], ['EMAIL', (m) => m.email], ['NAME', (m) => m.name], ['ROLE', (m) => m.role], ['JOINED', (m) => m.created_at]],
      );
    },
  },

  'member set-role': {
    usage: 'orgauth member set-role --org ID --email E --role owner|admin|member|viewer|<custom role>',
    summary: "change a member's role (the last owner cannot be demoted)",
    options: { org: { type: 'string' }, email: { type: 'string' }, role: { type: 'string' } },
    run: async ({ db }, v) => {
      const { organizationId, user } = await memberByEmail(db, v);
      const role = await cliRole(db, organizationId, required(v, 'role'));
      const m = await changeMemberRole(db, { organizationId, userId: user.id, role });
      return { json: m, text: `${user.email} is now ${m.role} of organization ${organizationId}` };
    },
  },

  'member remove': {
    usage: 'orgauth member remove --org ID --email E',
    summary: 'remove a member and revoke the grants they gave there (the last owner cannot be removed)',
    options: { org: { type: 'string' }, email: { type: 'string' } },
    run: async ({ db }, v) => {
      const { organizationId, user } = await memberByEmail(db, v);
      await removeMember(db, { organizationId, userId: user.id });
      return { json: { organization_id: organizationId, user_id: user.id, removed: true }, text: `removed ${user.email} from organization ${organizationId}` };
    },
  },

  'role list': {
    usage: 'orgauth role list --org ID',
    summary: "list an organization's roles: the built-in ones, then its own",
    options: { org: { type: 'string' } },
    run: async ({ db }, v) => {
      const roles = (await listRoles(db, orgId(v))).map(roleOut);
      return { json: roles, text: table(['NAME', 'BUILTIN', 'PERMISSIONS'], roles.map((r) => [r.name, r.builtin ? 'yes' : 'no', r.permissions.join(' ')])) };
    },
  },

  'role create': {
    usage: 'orgauth role create --org ID --name N --permissions "contacts.read contacts.write" [--description D]',
    summary: 'create a custom role',
    options: { org: { type: 'string' }, name: { type: 'string' }, permissions: { type: 'string' }, description: { type: 'string' } },
    run: async ({ db }, v) => {
      const role = await createRole(db, orgId(v), { name: required(v, 'name'), permissions: splitList(optionalString(v, 'permissions') ?? ''), description: optionalString(v, 'description') });
      return { json: roleOut(role), text: `created role ${role.name}: ${role.permissions.join(' ') || '(no permissions)'}` };
    },
  },

  'role update': {
    usage: 'orgauth role update --org ID --role NAME [--name NEW] [--permissions "…"] [--description D]',
    summary: "rename a custom role or change its permissions; members' grants lose what it loses",
    options: { org: { type: 'string' }, role: { type: 'string' }, name: { type: 'string' }, permissions: { type: 'string' }, description: { type: 'string' } },
    run: async ({ db }, v) => {
      const permissions = optionalString(v, 'permissions');
      const role = await updateRole(db, orgId(v), required(v, 'role'), {
        name: optionalString(v, 'name'),
        description: optionalString(v, 'description'),
        permissions: permissions === undefined ? undefined : splitList(permissions),
      });
      return { json: roleOut(role), text: `role ${role.name}: ${role.permissions.join(' ') || '(no permissions)'}` };
    },
  },

  'role delete': {
    usage: 'orgauth role delete --org ID --role NAME [--move-to ROLE]',
    summary: 'delete a custom role; its members move to --move-to',
    options: { org: { type: 'string' }, role: { type: 'string' }, 'move-to': { type: 'string' } },
    run: async ({ db }, v) => {
      const name = required(v, 'role');
      const { moved } = await deleteRole(db, orgId(v), name, { moveTo: optionalString(v, 'move-to') });
      return { json: { name, deleted: true, members_moved: moved }, text: `deleted role ${name}${moved > 0 ? `; ${moved} member(s) moved to ${optionalString(v, 'move-to')}` : ''}` };
    },
  },

  'app create': {
    usage:
      'orgauth app create --org ID --type public|private --name N [--redirect-uri URI]... [--post-logout-redirect-uri URI]... [--scopes "contacts.read tasks.read"] [--require-pkce]',
    summary:
      'register an application; prints its client secret once. Public applications only: --redirect-uri (at least one) and --post-logout-redirect-uri (where RP-initiated logout may send the browser), each repeatable',
    options: {
      org: { type: 'string' },
      type: { type: 'string' },
      name: { type: 'string' },
      'redirect-uri': { type: 'string', multiple: true },
      'post-logout-redirect-uri': { type: 'string', multiple: true },
      scopes: { type: 'string' },
      'require-pkce': { type: 'boolean' },
    },
    run: async ({ db }, v) => {
      const type = required(v, 'type');
      if (type !== 'public' && type !== 'private') throw new UsageError('--type must be public or private');
      const app = await createApplication(db, {
        organizationId: orgId(v),
        type,
        name: required(v, 'name'),
        redirectUris: repeated(v, 'redirect-uri'),
        postLogoutRedirectUris: repeated(v, 'post-logout-redirect-uri'),
        ...(typeof v.scopes === 'string' ? { scopes: v.scopes } : {}),
        requirePkce: v['require-pkce'] === true,
      });
      return {
        json: app,
        text: [
          `created ${app.type} application "${app.name}" in organization ${app.organization_id}`,
          `client_id:     ${app.client_id}`,
          `client_secret: ${app.client_secret}   (shown once; only its hash is stored)`,
          `scopes:        ${app.scopes.join(' ')}`,
          ...(app.redirect_uris.length > 0 ? [`redirect_uris: ${app.redirect_uris.join(' ')}`] : []),
          ...(app.post_logout_redirect_uris.length > 0 ? [`post_logout_redirect_uris: ${app.post_logout_redirect_uris.join(' ')}`] : []),
        ].join('\n'),
      };
    },
  },

  'app list': {
    usage: `orgauth app list --org ID ${PAGE_USAGE}`,
    summary: "list an organization's applications (never their secrets)",
    options: { org: { type: 'string' }, ...PAGE_OPTIONS },
    run: async ({ db }, v) => {
      const organizationId = orgId(v);
      return listed(
        v,
        (limit) => listApplications(db, organizationId, { afterId: decodeCursor(optionalString(v, 'cursor')), limit }),
        (a) => a.id,
        (a) => ({ organization_id: a.organization_id, ...applicationOut(a) }),
        [
          ['CLIENT_ID', (a) => a.client_id],
          ['TYPE', (a) => a.type],
          ['NAME', (a) => a.name],
          ['STATUS', (a) => (a.disabled ? 'disabled' : 'active')],
          ['SCOPES', (a) => a.scopes.join(' ')],
        ],
      );
    },
  },

  'app show': {
    usage: 'orgauth app show --client-id ID',
    summary: 'show an application (never its secret)',
    options: { 'client-id': { type: 'string' } },
    run: async ({ db }, v) => {
      const a = await applicationByClientId(db, required(v, 'client-id'));
      const shown = { organization_id: a.organization_id, ...applicationOut(a) };
      const width = Math.max(...Object.keys(shown).map((k) => k.length)) + 2;
      return {
        json: shown,
        text: Object.entries(shown)
          .map(([k, value]) => `${`${k}:`.padEnd(width)}${Array.isArray(value) ? value.join(' ') : String(value)}`)
          .join('\n'),
      };
    },
  },

  'app update': {
    usage:
      'orgauth app update --client-id ID [--name N] [--redirect-uri URI]... [--post-logout-redirect-uri URI]... [--no-post-logout-redirect-uris] [--scopes "contacts.read"] [--require-pkce yes|no]',
    summary:
      'change an application; what is not given stays. --redirect-uri and --post-logout-redirect-uri replace the whole list (repeat them for several); narrowing --scopes revokes the grants holding a removed scope',
    options: {
      'client-id': { type: 'string' },
      name: { type: 'string' },
      'redirect-uri': { type: 'string', multiple: true },
      'post-logout-redirect-uri': { type: 'string', multiple: true },
      'no-post-logout-redirect-uris': { type: 'boolean' },
      scopes: { type: 'string' },
      'require-pkce': { type: 'string' },
    },
    run: async ({ db }, v) => {
      const application = await applicationByClientId(db, required(v, 'client-id'));
      const postLogout = repeated(v, 'post-logout-redirect-uri');
      if (postLogout.length > 0 && v['no-post-logout-redirect-uris'] === true) throw new UsageError('--post-logout-redirect-uri and --no-post-logout-redirect-uris contradict each other');
      const pkce = optionalString(v, 'require-pkce');
      if (pkce !== undefined && pkce !== 'yes' && pkce !== 'no') throw new UsageError('--require-pkce must be yes or no');
      const redirectUris = repeated(v, 'redirect-uri');
      const a = await updateApplication(db, application, {
        ...(typeof v.name === 'string' ? { name: v.name } : {}),
        ...(redirectUris.length > 0 ? { redirectUris } : {}),
        ...(postLogout.length > 0 ? { postLogoutRedirectUris: postLogout } : v['no-post-logout-redirect-uris'] === true ? { postLogoutRedirectUris: [] } : {}),
        ...(typeof v.scopes === 'string' ? { scopes: v.scopes } : {}),
        ...(pkce !== undefined ? { requirePkce: pkce === 'yes' } : {}),
      });
      return { json: { organization_id: a.organization_id, ...applicationOut(a) }, text: `updated application ${a.client_id} "${a.name}"` };
    },
  },

  'app rotate-secret': {
    usage: 'orgauth app rotate-secret --client-id ID',
    summary: "replace an application's client secret; the old one stops working at once",
    options: { 'client-id': { type: 'string' } },
    run: async ({ db }, v) => {
      const result = await rotateClientSecret(db, await applicationByClientId(db, required(v, 'client-id')));
      return {
        json: result,
        text: `client_id:     ${result.client_id}\nclient_secret: ${result.client_secret}   (shown once; the old secret no longer works)`,
      };
    },
  },

  'app disable': {
    usage: 'orgauth app disable --client-id ID',
    summary: 'disable an application: its credentials and tokens stop working on every instance within a second; its grants are revoked',
    options: { 'client-id': { type: 'string' } },
    run: async ({ db }, v) => {
      const a = await updateApplication(db, await applicationByClientId(db, required(v, 'client-id')), { disabled: true });
      return { json: { organization_id: a.organization_id, ...applicationOut(a) }, text: `disabled application ${a.client_id} "${a.name}"` };
    },
  },

  'app delete': {
    usage: 'orgauth app delete --client-id ID',
    summary: 'delete an application after revoking every grant of it',
    options: { 'client-id': { type: 'string' } },
    run: async ({ db }, v) => {
      const a = await applicationByClientId(db, required(v, 'client-id'));
      await deleteApplication(db, a);
      return { json: { client_id: a.client_id, organization_id: a.organization_id, deleted: true }, text: `deleted application ${a.client_id} "${a.name}"` };
    },
  },

  'token create': {
    usage: 'orgauth token create --client-id ID [--scopes "contacts.read tasks.read"]',
    summary: "issue a private application's access token for its organization (as client_credentials does)",
    options: { 'client-id': { type: 'string' }, scopes: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const application = await applicationByClientId(db, required(v, 'client-id'));
      if (application.type !== 'private') throw new UnauthorizedClientError('tokens are issued directly only to private applications');
      if (application.disabled) throw new UnauthorizedClientError('the application is disabled');
      const scopes = grantableScopes(optionalString(v, 'scopes'), application.scopes);
      await ensureSigningKey(db, { alg: config.signingAlg, secretKey: config.secretKey });
      const response = await issueClientToken({ db, keys: new KeyStore(db, config), config, clientGrants: new ClientGrants(db) }, application, scopes);
      return {
        json: response,
        text: [
          `access token for organization ${response.organization_id} "${response.organization_name}", scopes ${response.scope}, valid ${response.expires_in} s:`,
          response.access_token,
        ].join('\n'),
      };
    },
  },

  'grant list': {
    usage: `orgauth grant list --org ID ${PAGE_USAGE}`,
    summary: "list an organization's connected apps (live grants), newest first",
    options: { org: { type: 'string' }, ...PAGE_OPTIONS },
    run: async ({ db }, v) => {
      const organizationId = orgId(v);
      return listed(
        v,
        (limit) => listLiveGrants(db, organizationId, { beforeId: decodeDescendingCursor(optionalString(v, 'cursor')), limit }),
        (g) => g.id,
        grantOut,
        [
          ['ID', (g) => String(g.id)],
          ['APPLICATION', (g) => `${g.application.name} (${g.application.client_id})`],
          ['AUTHORIZED BY', (g) => g.user?.email ?? 'the application itself'],
          ['SCOPES', (g) => g.scopes.join(' ')],
          ['LAST USED', (g) => g.last_used_at ?? 'never'],
        ],
      );
    },
  },

  'grant revoke': {
    usage: 'orgauth grant revoke --id ID',
    summary: "revoke a grant: its tokens stop working on every instance within a second",
    options: { id: { type: 'string' } },
    run: async ({ db }, v) => {
      const raw = required(v, 'id');
      const id = parseCanonicalId(raw);
      if (id === undefined) throw new UsageError('--id must be a positive integer');
      if (!(await revokeGrant(db, id, 'revoked_by_admin'))) throw new NotFoundError(`no live grant with id ${raw}`);
      return { json: { id, revoked: true }, text: `revoked grant ${id}` };
    },
  },

  'keys rotate': {
    usage: 'orgauth keys rotate',
    summary: 'make a new signing key (SIGNING_ALG) active; older keys still verify until their tokens expire',
    options: {},
    run: async ({ db, config }) => {
      const key = await rotateSigningKey(db, { alg: config.signingAlg, secretKey: config.secretKey });
      return { json: key, text: `new signing key ${key.kid} (${key.alg}) is active` };
    },
  },

  'keys list': {
    usage: 'orgauth keys list',
    summary: 'list the signing keys, newest first: active, retired (still verifying) or expired',
    options: {},
    run: async ({ db, config }) => {
      const keys = (await listSigningKeys(db, config)).map((k) => ({
        kid: k.kid,
        alg: k.alg,
        status: k.status,
        created_at: k.created_at.toISOString(),
        retired_at: k.retired_at?.toISOString() ?? null,
      }));
      return {
        json: { data: keys },
        text: table(['KID', 'ALG', 'STATUS', 'CREATED', 'RETIRED'], keys.map((k) => [k.kid, k.alg, k.status, k.created_at, k.retired_at ?? ''])),
      };
    },
  },

  cleanup: {
    usage: 'orgauth cleanup',
    summary: 'delete expired codes, refresh tokens, access-token revocations, sessions, email links, old invitations and sent emails now (the server does it every CLEANUP_INTERVAL seconds)',
    options: {},
    run: async ({ db }) => {
      const deleted = await deleteExpired(db);
      return { json: { deleted }, text: `deleted ${Object.entries(deleted).map(([table, n]) => `${n} ${table.replaceAll('_', ' ')}`).join(', ')}` };
    },
  },

  'seed-demo': {
    usage: 'orgauth seed-demo',
    summary: 'create the demo user, organization and applications; prints their secrets once',
    options: {},
    run: async ({ db, config }) => {
      const seed = await seedDemo(db);
      return { json: seed, text: formatDemoBanner(seed, config.issuer) };
    },
  },
};

/**
 * How long a command waits for an embedded database in use by a server that is starting, or by
 * other commands: each opens the database, runs and closes it in a second or two, more on a busy
 * machine (three at once, on two loaded cores in CI, took more than 5 s).
 */
const IN_USE_WAIT_MS = 15_000;

const GLOBAL_OPTIONS: Options = { json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } };

function helpText(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((k) => k.length));
  return [
    'usage: orgauth <command> [options] [--json]',
    '',
    'commands:',
    ...Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`),
    '',
    'Every command uses the server\'s configuration (DATABASE_URL, DATA_DIR, SECRET_KEY, ...).',
    'On the embedded database, while the server runs, commands are run by that server.',
    'With --json a command prints exactly one JSON object on stdout.',
    'Run `orgauth <command> --help` for its options.',
  ].join('\n');
}

export interface CliIo {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env: NodeJS.ProcessEnv;
}

/** Finds the command named by the leading words of argv ("app create"), longest name first. */
function findCommand(argv: string[]): { name: string; command: Command; rest: string[] } | undefined {
  for (const words of [2, 1]) {
    const name = argv.slice(0, words).join(' ');
    const command = Object.hasOwn(COMMANDS, name) ? COMMANDS[name] : undefined;
    if (command && argv.slice(0, words).every((w) => !w.startsWith('-'))) return { name, command, rest: argv.slice(words) };
  }
  return undefined;
}

const failure = (json: boolean, code: string, description: string): CommandOutcome => ({
  code: 1,
  stdout: '',
  stderr: json ? `${JSON.stringify({ error: code, error_description: description })}\n` : `orgauth: ${description}\n`,
});

type Parsed = { outcome: CommandOutcome } | { command: Command; values: Values; json: boolean };

/** Reads the command line: help and usage errors are answered here, before any database is opened. */
function parseCommandLine(argv: string[]): Parsed {
  const json = argv.includes('--json');
  const found = findCommand(argv);
  if (!found) {
    if (argv.length === 0 || argv[0] === '--help' || argv[0] === '-h' || argv[0] === 'help') return { outcome: { code: 0, stdout: `${helpText()}\n`, stderr: '' } };
    return { outcome: failure(json, 'usage', `unknown command "${argv.filter((a) => !a.startsWith('-')).slice(0, 2).join(' ')}"; run \`orgauth --help\``) };
  }
  let values: Values;
  try {
    values = parseArgs({ args: found.rest, options: { ...GLOBAL_OPTIONS, ...found.command.options }, strict: true, allowPositionals: false }).values;
  } catch (err) {
    return { outcome: failure(json, 'usage', `${err instanceof Error ? err.message.split('\n')[0] : String(err)}\nusage: ${found.command.usage}`) };
  }
  if (values.help === true) return { outcome: { code: 0, stdout: `usage: ${found.command.usage}\n  ${found.command.summary}\n`, stderr: '' } };
  return { command: found.command, values, json };
}

async function execute(parsed: Exclude<Parsed, { outcome: CommandOutcome }>, ctx: CommandContext): Promise<CommandOutcome> {
  const { command, values, json } = parsed;
  try {
    const result = await command.run(ctx, values);
    return { code: 0, stdout: json ? `${JSON.stringify(result.json)}\n` : `${result.text}\n`, stderr: '' };
  } catch (err) {
    if (err instanceof UsageError) return failure(json, 'usage', `${err.description}\nusage: ${command.usage}`);
    if (err instanceof AppError) return failure(json, err.code, err.description);
    return failure(json, 'server_error', describeStartupError(err).join('; '));
  }
}

/** Runs a command line on an open database: what the server does for a command sent to its admin socket. Never throws. */
export async function runCommandLine(argv: string[], ctx: CommandContext): Promise<CommandOutcome> {
  const parsed = parseCommandLine(argv);
  return 'outcome' in parsed ? parsed.outcome : execute(parsed, ctx);
}

/** Runs one command; returns the exit code. Never throws. */
export async function runCli(argv: string[], io: CliIo): Promise<number> {
  const emit = (outcome: CommandOutcome): number => {
    if (outcome.stdout) io.stdout(outcome.stdout);
    if (outcome.stderr) io.stderr(outcome.stderr);
    return outcome.code;
  };
  const parsed = parseCommandLine(argv);
  if ('outcome' in parsed) return emit(parsed.outcome);

  const startupFailure = (err: unknown) =>
    failure(parsed.json, err instanceof ConfigError ? 'invalid_configuration' : err instanceof AppError ? err.code : 'startup_failed', describeStartupError(err).join('; '));
  let config: Config;
  try {
    config = loadConfig(io.env);
  } catch (err) {
    return emit(startupFailure(err));
  }
  // The embedded database may belong to a running server, which then runs the command; to a
  // server still starting (no socket yet); or to another command, finishing soon. Both are
  // waited for, a little.
  const deadline = Date.now() + IN_USE_WAIT_MS;
  let opened: Awaited<ReturnType<typeof openDatabase>>;
  for (;;) {
    try {
      opened = await openDatabase(config);
      break;
    } catch (err) {
      if (!(err instanceof DatabaseInUseError)) return emit(startupFailure(err));
      const forwarded = await sendToAdminSocket(config.dataDir, argv);
      if ('outcome' in forwarded) return emit(forwarded.outcome);
      if ('error' in forwarded) return emit(failure(parsed.json, err.code, `${err.description}; its admin socket cannot be used: ${forwarded.error}`));
      if (Date.now() > deadline) return emit(startupFailure(err));
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  try {
    return emit(await execute(parsed, { db: opened.handle.db, config, applied: opened.applied }));
  } finally {
    await opened.handle.close();
  }
}
