/**
 * Modules a server may never need (passkeys, SAML, SMTP, Redis) are loaded when first used, not
 * at start: importing them all made every start (and every CLI command) about half a second
 * slower. `lazyImport(() => import('x'))` loads `x` once, on the first call, and gives every
 * caller the same module.
 */
export function lazyImport<T>(load: () => Promise<T>): () => Promise<T> {
  let loaded: Promise<T> | undefined;
  return () => (loaded ??= load());
}
