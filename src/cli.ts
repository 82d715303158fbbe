/**
 * The `orgauth` command: administration from a shell, with the server's configuration.
 * With --json every command prints exactly one JSON object on stdout; errors go to stderr and
 * the exit code is 1.
 */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { z } from 'zod';
import { addMember, createOrganization, organizationIdSchema, ROLES } from './accounts/organizations.js';
import { createUser, getUserByEmail } from './accounts/users.js';
import { ConfigError, loadConfig, type Config } from './config.js';
import type { DB } from './db/connect.js';
import { formatDemoBanner, seedDemo } from './demo.js';
import { AppError, InvalidRequestError, NotFoundError } from './errors.js';
import { parseInput } from './lib/validate.js';
import { createApplication, findApplicationByClientId, rotateClientSecret } from './oauth/applications.js';
import { UnauthorizedClientError } from './oauth/errors.js';
import { KeyStore } from './oauth/key-store.js';
import { grantableScopes } from './oauth/scopes.js';
import { issueClientToken } from './oauth/token-response.js';
import { ClientGrants } from './oauth/client-grants.js';
import { ensureSigningKey, rotateSigningKey } from './oauth/keys.js';
import { deleteExpired } from './retention.js';
import { describeStartupError, openDatabase } from './runtime.js';

type Options = NonNullable<ParseArgsConfig['options']>;
type Values = Record<string, string | boolean | (string | boolean)[] | undefined>;

interface Context {
  db: DB;
  config: Config;
  /** Migrations applied while opening the database. */
  applied: string[];
}

interface Command {
  usage: string;
  summary: string;
  options: Options;
  run(ctx: Context, values: Values): Promise<{ json: object; text: string }>;
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

function orgId(values: Values): number {
  return parseInput(organizationIdSchema, required(values, 'org'));
}

const COMMANDS: Record<string, Command> = {
  migrate: {
    usage: 'orgauth migrate',
    summary: 'apply pending database migrations',
    options: {},
    run: async ({ applied }) => ({
      json: { applied },
      text: applied.length > 0 ? `applied ${applied.join(', ')}` : 'the database is up to date',
    }),
  },

  'user create': {
    usage: 'orgauth user create --email E --password P [--name N]',
    summary: 'create a user (password: at least 10 characters)',
    options: { email: { type: 'string' }, password: { type: 'string' }, name: { type: 'string' } },
    run: async ({ db }, v) => {
      const user = await createUser(db, { email: required(v, 'email'), password: required(v, 'password'), name: optionalString(v, 'name') });
      return { json: user, text: `created user ${user.id} <${user.email}>` };
    },
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

  'member add': {
    usage: 'orgauth member add --org ID --email E [--role owner|admin|member]',
    summary: 'add an existing user to an organization (role member by default)',
    options: { org: { type: 'string' }, email: { type: 'string' }, role: { type: 'string' } },
    run: async ({ db }, v) => {
      const role = parseInput(z.enum(ROLES, { error: `--role must be one of ${ROLES.join(', ')}` }), optionalString(v, 'role') ?? 'member');
      const organizationId = orgId(v);
      const user = await getUserByEmail(db, required(v, 'email'));
      const m = await addMember(db, { organizationId, userId: user.id, role });
      return { json: m, text: `added ${user.email} to organization ${m.organization_id} as ${m.role}` };
    },
  },

  'app create': {
    usage:
      'orgauth app create --org ID --type public|private --name N [--redirect-uri URI]... [--scopes "contacts.read tasks.read"] [--require-pkce]',
    summary: 'register an application; prints its client secret once',
    options: {
      org: { type: 'string' },
      type: { type: 'string' },
      name: { type: 'string' },
      'redirect-uri': { type: 'string', multiple: true },
      scopes: { type: 'string' },
      'require-pkce': { type: 'boolean' },
    },
    run: async ({ db }, v) => {
      const type = required(v, 'type');
      if (type !== 'public' && type !== 'private') throw new UsageError('--type must be public or private');
      const redirectUris = v['redirect-uri'];
      const app = await createApplication(db, {
        organizationId: orgId(v),
        type,
        name: required(v, 'name'),
        redirectUris: Array.isArray(redirectUris) ? redirectUris.filter((u) => typeof u === 'string') : [],
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
        ].join('\n'),
      };
    },
  },

  'app rotate-secret': {
    usage: 'orgauth app rotate-secret --client-id ID',
    summary: "replace an application's client secret; the old one stops working at once",
    options: { 'client-id': { type: 'string' } },
    run: async ({ db }, v) => {
      const clientId = required(v, 'client-id');
      const application = await findApplicationByClientId(db, clientId);
      if (!application) throw new NotFoundError(`no application with client_id ${clientId}`);
      const result = await rotateClientSecret(db, application);
      return {
        json: result,
        text: `client_id:     ${result.client_id}\nclient_secret: ${result.client_secret}   (shown once; the old secret no longer works)`,
      };
    },
  },

  'token create': {
    usage: 'orgauth token create --client-id ID [--scopes "contacts.read tasks.read"]',
    summary: "issue a private application's access token for its organization (as client_credentials does)",
    options: { 'client-id': { type: 'string' }, scopes: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const clientId = required(v, 'client-id');
      const application = await findApplicationByClientId(db, clientId);
      if (!application) throw new NotFoundError(`no application with client_id ${clientId}`);
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

  'keys rotate': {
    usage: 'orgauth keys rotate',
    summary: 'make a new signing key (SIGNING_ALG) active; older keys still verify until their tokens expire',
    options: {},
    run: async ({ db, config }) => {
      const key = await rotateSigningKey(db, { alg: config.signingAlg, secretKey: config.secretKey });
      return { json: key, text: `new signing key ${key.kid} (${key.alg}) is active` };
    },
  },

  cleanup: {
    usage: 'orgauth cleanup',
    summary: 'delete expired codes, refresh tokens, access-token revocations and sessions now (the server does it every CLEANUP_INTERVAL seconds)',
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
    const command = COMMANDS[name];
    if (command && argv.slice(0, words).every((w) => !w.startsWith('-'))) return { name, command, rest: argv.slice(words) };
  }
  return undefined;
}

/** Runs one command; returns the exit code. Never throws. */
export async function runCli(argv: string[], io: CliIo): Promise<number> {
  const json = argv.includes('--json');
  const fail = (code: string, description: string): number => {
    io.stderr(json ? `${JSON.stringify({ error: code, error_description: description })}\n` : `orgauth: ${description}\n`);
    return 1;
  };

  const found = findCommand(argv);
  if (!found) {
    if (argv.length === 0 || argv[0] === '--help' || argv[0] === '-h' || argv[0] === 'help') {
      io.stdout(`${helpText()}\n`);
      return 0;
    }
    return fail('usage', `unknown command "${argv.filter((a) => !a.startsWith('-')).slice(0, 2).join(' ')}"; run \`orgauth --help\``);
  }

  let values: Values;
  try {
    values = parseArgs({ args: found.rest, options: { ...GLOBAL_OPTIONS, ...found.command.options }, strict: true, allowPositionals: false }).values;
  } catch (err) {
    return fail('usage', `${err instanceof Error ? err.message.split('\n')[0] : String(err)}\nusage: ${found.command.usage}`);
  }
  if (values.help === true) {
    io.stdout(`usage: ${found.command.usage}\n  ${found.command.summary}\n`);
    return 0;
  }

  let config: Config;
  let opened: Awaited<ReturnType<typeof openDatabase>>;
  try {
    config = loadConfig(io.env);
    opened = await openDatabase(config);
  } catch (err) {
    const code = err instanceof ConfigError ? 'invalid_configuration' : err instanceof AppError ? err.code : 'startup_failed';
    return fail(code, describeStartupError(err).join('; '));
  }
  try {
    const result = await found.command.run({ db: opened.handle.db, config, applied: opened.applied }, values);
    io.stdout(json ? `${JSON.stringify(result.json)}\n` : `${result.text}\n`);
    return 0;
  } catch (err) {
    if (err instanceof UsageError) return fail('usage', `${err.description}\nusage: ${found.command.usage}`);
    if (err instanceof AppError) return fail(err.code, err.description);
    return fail('server_error', describeStartupError(err).join('; '));
  } finally {
    await opened.handle.close();
  }
}
