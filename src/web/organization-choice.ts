/**
 * The organization choice of a consent page (views/organization-choice.eta): per organization of
 * the user's, what their role there lets them grant of what was asked for, and whether it can be
 * chosen. An organization whose role allows nothing asked for, or that requires a sign-in the
 * session lacks (its single sign-on, two steps: organization-access.ts), is shown but cannot be
 * chosen, with what to do (the form's handler checks again).
 */
import type { UserOrganization } from '../accounts/organizations.js';
import { sessionShortfall } from '../accounts/organization-access.js';
import type { SessionUser } from '../accounts/sessions.js';
import { roleHoldsScope, type RoleRef } from '../accounts/roles.js';
import { IDENTITY_SCOPE_DESCRIPTIONS, isIdentityScope, isKnownScope, SCOPE_DESCRIPTIONS } from '../oauth/helpers/scopes.js';
import type { TokenResource } from '../oauth/models/resources.js';
import { twoFactorsPath } from './second-step.js';
import { ssoSignInPath } from './sign-in.js';

/**
 * What the user may grant in an organization: the scopes asked for (already within the
 * application's) that their role there holds, and the ones it does not.
 */
export function grantableByRole(requested: readonly string[], role: RoleRef): { granted: string[]; refused: string[] } {
  return { granted: requested.filter((s) => roleHoldsScope(role, s)), refused: requested.filter((s) => !roleHoldsScope(role, s)) };
}

export interface DescribedScope {
  name: string;
  description: string;
}

/** What each scope means, as the pages say it; a resource's own names say whose they are. */
export function describeScopes(scopes: readonly string[], resource: Pick<TokenResource, 'name'>): DescribedScope[] {
  return scopes.map((name) => ({
    name,
    description: isIdentityScope(name) ? IDENTITY_SCOPE_DESCRIPTIONS[name] : isKnownScope(name) ? SCOPE_DESCRIPTIONS[name] : `${name} at ${resource.name}`,
  }));
}

export interface OrganizationChoice {
  id: number;
  name: string;
  role: string;
  /** What choosing it grants (the OpenID scopes with it); empty when it cannot be chosen. */
  granted: DescribedScope[];
  refused: DescribedScope[];
  choosable: boolean;
  /** It requires the user to sign in through its identity provider, and this session did not (SS-4). */
  needsSso: boolean;
  /** Where to sign in through it and come back to `returnTo`. */
  ssoLink: string;
  needsTwoFactors: boolean;
  /** Where to take the second step (or set one up) and come back to `returnTo`. */
  twoFactorsLink: string;
}

export function organizationChoices(input: {
  memberships: readonly UserOrganization[];
  user: SessionUser;
  /** What is asked for, within what the client may have. */
  scopes: readonly string[];
  identityScopes: readonly string[];
  resource: Pick<TokenResource, 'name'>;
  /** Whether the user has a second factor to take the step with. */
  hasFactor: boolean;
  returnTo: string;
}): OrganizationChoice[] {
  const { user, scopes, identityScopes, resource } = input;
  return input.memberships.map((o) => {
    const { granted, refused } = grantableByRole(scopes, o.access);
    // Something of what was asked for, or only signing in (the OpenID scopes), which any member may do.
    const grantable = granted.length > 0 || scopes.length === 0;
    const shortfall = grantable ? sessionShortfall(o, user) : undefined;
    const needsSso = shortfall === 'sso';
    const needsTwoFactors = shortfall === 'two_factors';
    const choosable = grantable && shortfall === undefined;
    return {
      id: o.id,
      name: o.name,
      role: o.role,
      granted: describeScopes(choosable ? [...identityScopes, ...granted] : [], resource),
      refused: describeScopes(refused, resource),
      choosable,
      needsSso,
      ssoLink: needsSso ? ssoSignInPath(user.email, input.returnTo) : '',
      needsTwoFactors,
      twoFactorsLink: needsTwoFactors ? twoFactorsPath(input.hasFactor, input.returnTo) : '',
    };
  });
}

/** The one to preselect: the only one that can be chosen, or the one whose identity provider signed the user in. */
export function preselectedOrganization(choices: readonly OrganizationChoice[], user: Pick<SessionUser, 'ssoOrganizationId'>): number | undefined {
  const choosable = choices.filter((o) => o.choosable);
  return choosable.length === 1 ? choosable[0]!.id : choosable.find((o) => o.id === user.ssoOrganizationId)?.id;
}
