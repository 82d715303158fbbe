import { InvalidRequestError } from '../../errors.js';
import { UnauthorizedClientError } from '../errors.js';
import { parseCanonicalId, requireParam } from '../helpers/params.js';
import { resourceScopes } from '../models/resources.js';
import { issueClientToken } from './token-response.js';
import type { GrantHandler } from './types.js';

/**
 * client_credentials (RFC 6749 §4.4): a private application acting for its own organization.
 * The contract has it send organization_id; it must name the application's organization (CC-1).
 */
export const clientCredentials: GrantHandler = {
  grantType: 'client_credentials',
  async handle(ctx, { application }, params, { dpopJkt }) {
    if (application.type !== 'private') throw new UnauthorizedClientError('client_credentials is only for private applications');
    const organizationId = parseCanonicalId(requireParam(params, 'organization_id'));
    if (organizationId === undefined) throw new InvalidRequestError('organization_id must be a positive integer');
    if (organizationId !== application.organization_id) throw new InvalidRequestError("organization_id must be the application's organization");
    // RFC 8707: a token for the named resource, with scopes it lists (the organization acting for
    // itself holds a resource's declared scopes, as its owners and admins do).
    const resource = await ctx.resources.resolve(params.resource);
    return issueClientToken(ctx, application, resourceScopes(params.scope, resource, application), resource, dpopJkt);
  },
};
