/** Where a directory's SCIM client sends its requests: `<issuer>/scim/v2/<directory id>` (RFC 7644 §3.13 calls it the base URI). */
export function scimBaseUrl(issuer: string, directoryId: number): string {
  return `${issuer}/scim/v2/${directoryId}`;
}
