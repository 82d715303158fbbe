/**
 * What a signed-in session lacks to act in one of its user's organizations: the one check behind
 * the dashboard, the consent pages (browser and device) and their forms. The token endpoint asks
 * the same of codes and grants in SQL (the grants' redeem and refresh statements).
 */
import type { UserOrganization } from './organizations.js';
import { type SessionUser, signedInWithTwoFactors } from './sessions.js';

/**
 * - `sso`: the organization requires this person to sign in through one of its own identity
 *   providers (SS-4), and the session was not signed in through one (a second step cannot help);
 * - `two_factors`: it requires two-step sign-in, and the session has one step.
 */
export type SessionShortfall = 'sso' | 'two_factors';

export function sessionShortfall(
  organization: Pick<UserOrganization, 'id' | 'requireMfa' | 'ssoRequired'>,
  session: Pick<SessionUser, 'amr' | 'ssoOrganizationId'>,
): SessionShortfall | undefined {
  // ssoOrganizationId is set only while the session's connection is active (findSession).
  if (organization.ssoRequired && session.ssoOrganizationId !== organization.id) return 'sso';
  if (organization.requireMfa && !signedInWithTwoFactors(session)) return 'two_factors';
  return undefined;
}
