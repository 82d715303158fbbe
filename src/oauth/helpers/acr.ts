/**
 * Authentication context classes (OIDC Core §2 `acr`, §3.1.2.1 `acr_values`): how strongly the
 * user signed in, read from the session's amr (RFC 8176). Two classes: a password alone, and
 * two factors (a password and a code or a passkey, or a passkey with user verification).
 */
export const ACR_PASSWORD = 'urn:orgauth:acr:password';
export const ACR_TWO_FACTORS = 'urn:orgauth:acr:mfa';
export const ACR_VALUES_SUPPORTED = [ACR_PASSWORD, ACR_TWO_FACTORS] as const;

/** The class a sign-in with these amr values reached; undefined for a grant made before amr was kept. */
export function acrOf(amr: readonly string[]): string | undefined {
  if (amr.length === 0) return undefined;
  return amr.includes('mfa') ? ACR_TWO_FACTORS : ACR_PASSWORD;
}

/**
 * Whether `acr_values` asks for two factors. acr_values is a voluntary request (OIDC Core
 * §3.1.2.1, §5.5.1.1): values we do not know are ignored; the ID token's acr says what the
 * sign-in reached.
 */
export function asksForTwoFactors(acrValues: string | undefined): boolean {
  return (acrValues ?? '').split(' ').includes(ACR_TWO_FACTORS);
}
