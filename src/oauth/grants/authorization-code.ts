import { sql } from 'kysely';
import { inTransaction } from '../../db/connect.js';
import { sha256Hex } from '../../lib/crypto.js';
import { UnauthorizedClientError, InvalidGrantError } from '../errors.js';
import { requireParam } from '../params.js';
import { verifyPkce } from '../pkce.js';
import { issueUserTokens } from '../token-response.js';
import type { GrantHandler } from './types.js';

/**
 * authorization_code (RFC 6749 §4.1.3). The code is consumed atomically, in the same
 * transaction that creates the grant and its tokens; a second redemption revokes what the
 * first one issued (CD-1, RFC 6749 §4.1.2).
 */
export const authorizationCode: GrantHandler = {
  grantType: 'authorization_code',
  async handle(ctx, { application }, params) {
    // Private applications act for their organization only (client_credentials), never for users.
    if (application.type !== 'public') throw new UnauthorizedClientError('this grant type is for public applications');
    const code = requireParam(params, 'code');
    // RFC 6749 §4.1.3: required here because /authorize requires it.
    const redirectUri = requireParam(params, 'redirect_uri');
    const verifier = params.code_verifier;

    const row = await ctx.db
      .selectFrom('authorization_codes as c')
      .innerJoin('organizations as o', 'o.id', 'c.organization_id')
      .selectAll('c')
      .select(['o.name as organization_name', sql<boolean>`c.expires_at <= now()`.as('expired')])
      .where('c.code_hash', '=', sha256Hex(code))
      .executeTakeFirst();
    // A code of another client is as good as unknown to this one (CD-3), and is left alone.
    if (!row || row.application_id !== application.id) throw new InvalidGrantError();
    if (row.consumed_at !== null) {
      if (row.grant_id !== null) await ctx.revocations.revoke(row.grant_id, 'code_replay', { actorClientId: application.client_id });
      throw new InvalidGrantError('the authorization code was already used');
    }
    if (row.expired) throw new InvalidGrantError('the authorization code expired');
    if (row.redirect_uri !== redirectUri) throw new InvalidGrantError('redirect_uri does not match the authorization request');
    if (row.code_challenge === null) {
      // PK-3: a verifier for a code issued without a challenge is a downgrade attempt.
      if (verifier !== undefined) throw new InvalidGrantError('code_verifier sent for a code issued without code_challenge');
    } else if (!verifyPkce(verifier, row.code_challenge)) {
      throw new InvalidGrantError('code_verifier is missing or does not match the code_challenge');
    }

    const signingKey = await ctx.keys.signingKey();
    const issued = await inTransaction(ctx.db, async (trx) => {
      const consumed = await trx
        .updateTable('authorization_codes')
        .set({ consumed_at: sql`now()` })
        .where('id', '=', row.id)
        .where('consumed_at', 'is', null)
        .returning('id')
        .executeTakeFirst();
      if (!consumed) return undefined;
      // The user may have left the organization, or the application lost scopes, since consent.
      const member = await trx
        .selectFrom('memberships')
        .select('role')
        .where('organization_id', '=', row.organization_id)
        .where('user_id', '=', row.user_id)
        .forShare()
        .executeTakeFirst();
      if (!member) throw new InvalidGrantError('the user is no longer a member of the organization');
      if (!row.scopes.every((s) => application.scopes.includes(s))) throw new InvalidGrantError('the application may no longer use the scope granted');
      const grant = await trx
        .insertInto('grants')
        .values({ organization_id: row.organization_id, application_id: application.id, user_id: row.user_id, scopes: row.scopes })
        .returning('id')
        .executeTakeFirstOrThrow();
      await trx.updateTable('authorization_codes').set({ grant_id: grant.id }).where('id', '=', row.id).execute();
      await trx
        .insertInto('audit_events')
        .values({
          organization_id: row.organization_id,
          actor_user_id: row.user_id,
          actor_client_id: application.client_id,
          action: 'grant.created',
          details: JSON.stringify({ grant_id: grant.id, application_id: application.id, user_id: row.user_id, scopes: row.scopes.join(' ') }),
        })
        .execute();
      return issueUserTokens(trx, ctx, signingKey, {
        grantId: grant.id,
        organizationId: row.organization_id,
        organizationName: row.organization_name,
        clientId: application.client_id,
        userId: row.user_id,
        accessScopes: row.scopes,
        refreshScopes: row.scopes,
        parentRefreshTokenId: null,
      });
    });
    if (issued) return issued;
    // Lost a race with a concurrent redemption of the same code: that is a second redemption too.
    const winner = await ctx.db.selectFrom('authorization_codes').select('grant_id').where('id', '=', row.id).executeTakeFirst();
    if (winner?.grant_id) await ctx.revocations.revoke(winner.grant_id, 'code_replay', { actorClientId: application.client_id });
    throw new InvalidGrantError('the authorization code was already used');
  },
};
