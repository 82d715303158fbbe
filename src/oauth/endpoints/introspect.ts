/**
 * POST /oauth/introspect (RFC 7662), client-authenticated. Who learns about a token:
 *
 * - the client it was issued to (its access and refresh tokens);
 * - the resource it is for (issue 44): a registered resource authenticated with its own
 *   credentials (models/resource-clients.ts) learns about the access tokens whose `aud` is its
 *   URI, as ZITADEL and Keycloak 26.7 rule. A resource is told nothing of another's tokens.
 *
 * Anything else is `{"active": false}`, the same answer whatever the reason (unknown, another's,
 * expired, revoked, its grant revoked, its user removed from the organization, its application
 * disabled): no oracle. An active answer is asked of the database, not the in-memory lists:
 * introspection is authoritative, and answers 503 (never active) when the database is away (MD-1,
 * MD-2).
 *
 * With `Accept: application/token-introspection+jwt` the answer is a JWT signed with the
 * server's key (RFC 9701): `token_introspection` holds the answer, `aud` the caller.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Application } from '../../db/schema.js';
import { InvalidClientError } from '../errors.js';
import { signJws } from '../models/key-store.js';
import { isResourceClient } from '../models/resource-clients.js';
import { accessTokenStatus } from '../models/token-status.js';
import { findClientToken } from '../helpers/client-token.js';
import { authenticatedForm, type OAuthEndpointOptions, registerFormEndpoint } from '../helpers/form-endpoint.js';
import { requireParam } from '../helpers/params.js';
import type { AccessTokenClaims } from '../models/access-tokens.js';

/** RFC 9701 §4: the media type of a signed introspection answer, and its JWT's typ. */
export const INTROSPECTION_JWT = 'application/token-introspection+jwt';
const INACTIVE = { active: false } as const;

type Answer = Record<string, unknown> & { active: boolean };

export async function introspectionEndpoint(app: FastifyInstance, options: OAuthEndpointOptions): Promise<void> {
  const { db, config } = options;
  /** The audience a caller may ask about besides its own tokens: a resource's URI. */
  async function audienceOf(caller: Application): Promise<string | undefined> {
    if (!isResourceClient(caller)) return undefined;
    return (await options.resources.byId(caller.resource_id))?.uri;
  }

  /** An access token, active or not, as the API would take it now. */
  async function accessTokenAnswer(c: AccessTokenClaims): Promise<Answer> {
    const status = await accessTokenStatus(db, options.applications.find, c);
    if (!status.live) return INACTIVE;
    return {
      active: true,
      // RFC 9449 §6.2: a DPoP-bound token says so, and names its key.
      token_type: c.cnf ? 'DPoP' : 'Bearer',
      scope: c.scope,
      client_id: c.client_id,
      sub: c.sub,
      organization_id: c.organization_id,
      organization_name: status.organizationName,
      iat: c.iat,
      exp: c.exp,
      iss: c.iss,
      aud: c.aud,
      jti: c.jti,
      ...(c.cnf ? { cnf: c.cnf } : {}),
      // RFC 8693 §4.1: who acts for the subject (a token exchanged with an actor).
      ...(c.act ? { act: c.act } : {}),
    };
  }

  async function answer(req: FastifyRequest): Promise<{ caller: Application; answer: Answer }> {
    const { body, client } = await authenticatedForm(req, options);
    const caller = client.application;
    // RFC 7662 §2.1: introspection is for authenticated callers (resource servers, confidential
    // clients); a public client's client_id alone is no authentication (metadata: not offered).
    if (client.method === 'none') throw new InvalidClientError({ cause: new Error('introspection needs client authentication') });
    const found = await findClientToken(options, caller, requireParam(body, 'token'), { audience: await audienceOf(caller) });
    if (!found) return { caller, answer: INACTIVE };
    if (found.kind === 'access_token') return { caller, answer: await accessTokenAnswer(found.claims) };
    const t = found.token;
    if (t.revoked_at !== null || t.grant_revoked_at !== null || t.ended_by_removal || t.rotated_at !== null || t.expired) return { caller, answer: INACTIVE };
    return {
      caller,
      answer: {
        active: true,
        token_type: 'refresh_token',
        scope: [...t.identity_scopes, ...t.scopes].join(' '),
        client_id: caller.client_id,
        sub: String(t.user_id),
        organization_id: t.organization_id,
        iat: Math.floor(t.created_at.getTime() / 1000),
        exp: Math.floor(t.expires_at.getTime() / 1000),
        iss: config.issuer,
        // RFC 9449 §6.2: the key its grant's tokens are bound to.
        ...(t.dpop_jkt !== null ? { cnf: { jkt: t.dpop_jkt } } : {}),
      },
    };
  }

  /** RFC 9701 §5: the answer as a JWT for the caller, when its Accept asks for one. */
  async function send(req: FastifyRequest, reply: FastifyReply, caller: Application, result: Answer): Promise<unknown> {
    // The answer's form depends on Accept: caches, if any came between, must key on it.
    reply.header('vary', 'accept');
    if (!wantsJwt(req.headers.accept)) return result;
    const key = await options.keys.signingKey();
    const header = Buffer.from(JSON.stringify({ alg: key.alg, kid: key.kid, typ: 'token-introspection+jwt' })).toString('base64url');
    const jwt = await signJws(key, header, { iss: config.issuer, aud: caller.client_id, iat: Math.floor(Date.now() / 1000), token_introspection: result });
    return reply.type(INTROSPECTION_JWT).send(jwt);
  }

  await registerFormEndpoint(app, '/oauth/introspect', async (req, reply) => {
    const { caller, answer: result } = await answer(req);
    return send(req, reply, caller, result);
  });
}

/**
 * Whether an Accept header prefers the JWT answer (RFC 9110 §12.5.1): it names the type with a q
 * above 0, and no higher q than it gives JSON (application/json, application/*, or *\/*).
 */
export function wantsJwt(accept: string | undefined): boolean {
  if (accept === undefined) return false;
  let jwt = 0;
  let json = 0;
  for (const range of accept.split(',')) {
    const [type, ...params] = range.split(';').map((p) => p.trim().toLowerCase());
    const qParam = params.find((p) => p.startsWith('q='));
    const q = qParam === undefined ? 1 : Number(qParam.slice(2));
    if (!Number.isFinite(q)) continue;
    if (type === INTROSPECTION_JWT) jwt = Math.max(jwt, q);
    else if (type === 'application/json' || type === 'application/*' || type === '*/*') json = Math.max(json, q);
  }
  return jwt > 0 && jwt >= json;
}
