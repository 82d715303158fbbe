import { applicationOut } from '../api/applications.js';
import { decodeCursor } from '../api/pagination.js';
import { readFileSync } from 'node:fs';
import type { IdTokenAlg } from '../db/schema.js';
import { createApplication, deleteApplication, type DeveloperAuthMethod, listApplications, rotateClientSecret, updateApplication } from '../oauth/models/applications.js';
import { applicationByClientId, listed, optionalString, orgId, PAGE_OPTIONS, PAGE_USAGE, repeated, required, UsageError, type Command, yesNo } from './shared.js';

export const appCommands: Record<string, Command> = {
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
          .map(([k, value]) => `${`${k}:`.padEnd(width)}${Array.isArray(value) ? value.join(' ') : value !== null && typeof value === 'object' ? JSON.stringify(value) : String(value)}`)
          .join('\n'),
      };
    },
  },

  'app update': {
    usage:
      'orgauth app update --client-id ID [--name N] [--redirect-uri URI]... [--post-logout-redirect-uri URI]... [--no-post-logout-redirect-uris] [--scopes "contacts.read"] [--require-pkce yes|no]' +
      ' [--token-endpoint-auth-method client_secret_basic|client_secret_post|private_key_jwt] [--jwks-file FILE | --jwks-uri URL] [--require-dpop yes|no] [--require-par yes|no]' +
      ' [--id-token-signed-response-alg RS256|ES256] [--fapi2 yes|no]',
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
      'token-endpoint-auth-method': { type: 'string' },
      'jwks-file': { type: 'string' },
      'jwks-uri': { type: 'string' },
      'require-dpop': { type: 'string' },
      'require-par': { type: 'string' },
      'id-token-signed-response-alg': { type: 'string' },
      fapi2: { type: 'string' },
    },
    run: async ({ db, config }, v) => {
      const application = await applicationByClientId(db, required(v, 'client-id'));
      if (typeof v['jwks-file'] === 'string' && typeof v['jwks-uri'] === 'string') throw new UsageError('--jwks-file and --jwks-uri contradict each other: register one');
      const jwks = typeof v['jwks-file'] === 'string' ? readJwksFile(v['jwks-file']) : undefined;
      const method = optionalString(v, 'token-endpoint-auth-method');
      const alg = optionalString(v, 'id-token-signed-response-alg');
      const postLogout = repeated(v, 'post-logout-redirect-uri');
      if (postLogout.length > 0 && v['no-post-logout-redirect-uris'] === true) throw new UsageError('--post-logout-redirect-uri and --no-post-logout-redirect-uris contradict each other');
      const pkce = yesNo(v, 'require-pkce');
      const redirectUris = repeated(v, 'redirect-uri');
      const a = await updateApplication(db, application, {
        ...(typeof v.name === 'string' ? { name: v.name } : {}),
        ...(redirectUris.length > 0 ? { redirectUris } : {}),
        ...(postLogout.length > 0 ? { postLogoutRedirectUris: postLogout } : v['no-post-logout-redirect-uris'] === true ? { postLogoutRedirectUris: [] } : {}),
        ...(typeof v.scopes === 'string' ? { scopes: v.scopes } : {}),
        ...(pkce !== undefined ? { requirePkce: pkce } : {}),
        // The domain checks the values (and names the field): the same rules as the API's.
        ...(method !== undefined ? { tokenEndpointAuthMethod: method as DeveloperAuthMethod } : {}),
        ...(jwks !== undefined ? { jwks } : {}),
        ...(typeof v['jwks-uri'] === 'string' ? { jwksUri: v['jwks-uri'] } : {}),
        dpopBoundAccessTokens: yesNo(v, 'require-dpop'),
        requirePushedAuthorizationRequests: yesNo(v, 'require-par'),
        ...(alg !== undefined ? { idTokenSignedResponseAlg: alg as IdTokenAlg } : {}),
        fapi2: yesNo(v, 'fapi2'),
      }, { allowHttp: config.outbound.allowHttp });
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
};

/** A JWK Set from a file (the public keys for private_key_jwt); its content is checked by the domain. */
export function readJwksFile(file: string): unknown {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new UsageError(`--jwks-file: cannot read ${file}: ${(err as Error).message}`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new UsageError(`--jwks-file: ${file} is not JSON (a JWK Set: {"keys": [...]})`);
  }
}
