import { sql } from 'kysely';
import { inTransaction } from '../../db/connect.js';
import { UnauthorizedClientError, InvalidGrantError, InvalidScopeError } from '../errors.js';
import { findRefreshToken } from '../refresh-tokens.js';
import { requireParam } from '../params.js';
import { issueUserTokens } from '../token-response.js';
import type { GrantHandler } from './types.js';

/**
 * refresh_token (RFC 6749 §6) with rotation and reuse detection (RFC 9700 §4.14.2): every use
 * retires the token and returns a new one. A retired token presented again within
 * REFRESH_REUSE_GRACE seconds (a client retrying a lost response) is refused; after that it is
 * taken as stolen and the whole grant is revoked.
 */
export const refreshToken: GrantHandler = {
  grantType: 'refresh_token',
  async handle(ctx, { application }, params) {
    // Private applications act for their organization only (client_credentials), never for users.
    if (application.type !== 'public') throw new UnauthorizedClientError('this grant type is for public applications');
    const presented = requireParam(params, 'refresh_token');
    const token = await findRefreshToken(ctx.db, presented);
    // RT-1: another client's refresh token is as good as unknown to this one.
    if (!token || token.application_id !== application.id || token.user_id === null) throw new InvalidGrantError();
    if (token.revoked_at !== null || token.grant_revoked_at !== null) throw new InvalidGrantError('the refresh token was revoked');
    if (token.expired) throw new InvalidGrantError('the refresh token expired');
    if (token.rotated_at !== null) {
      if ((token.seconds_since_rotation ?? 0) > ctx.config.refreshReuseGrace) {
        await ctx.revocations.revoke(token.grant_id, 'refresh_token_reuse', { actorClientId: application.client_id });
      }
      throw new InvalidGrantError('the refresh token was already used');
    }

    // RT-2: the scope may narrow, never widen; the organization never changes.
    let accessScopes = token.scopes;
    if (params.scope !== undefined) {
      const asked = params.scope.split(' ').filter((s) => s !== '');
      const wider = asked.filter((s) => !token.scopes.includes(s));
      if (asked.length === 0 || wider.length > 0) throw new InvalidScopeError('scope may only narrow the scope of the refresh token');
      accessScopes = token.scopes.filter((s) => asked.includes(s));
    }

    const userId = token.user_id;
    const signingKey = await ctx.keys.signingKey();
    const issued = await inTransaction(ctx.db, async (trx) => {
      // The grant first, then the token: the order revokeGrant locks them in, so a refresh and a
      // revocation of the same grant queue behind each other instead of deadlocking. A grant
      // revoked before us means no row (refuse); a revocation after us also revokes the token
      // issued here, since its refresh_tokens update runs once we commit.
      const live = await trx
        .updateTable('grants')
        .set({ last_used_at: sql`now()` })
        .where('id', '=', token.grant_id)
        .where('revoked_at', 'is', null)
        .returning('id')
        .executeTakeFirst();
      if (!live) throw new InvalidGrantError('the refresh token was revoked');
      // Exactly one concurrent refresh wins this update.
      const retired = await trx
        .updateTable('refresh_tokens')
        .set({ rotated_at: sql`now()` })
        .where('id', '=', token.id)
        .where('rotated_at', 'is', null)
        .where('revoked_at', 'is', null)
        .returning('id')
        .executeTakeFirst();
      if (!retired) return undefined;
      return issueUserTokens(trx, ctx, signingKey, {
        grantId: token.grant_id,
        organizationId: token.organization_id,
        organizationName: token.organization_name,
        clientId: application.client_id,
        userId,
        accessScopes,
        refreshScopes: token.scopes,
        parentRefreshTokenId: token.id,
      });
    });
    if (!issued) throw new InvalidGrantError('the refresh token was already used');
    return issued;
  },
};
