import type { SigningAlg } from '../config.js';
import { activeAlgorithms, listSigningKeys, rotateSigningKey } from '../oauth/models/signing-keys.js';
import { optionalString, table, type Command, UsageError } from './shared.js';

export const keyCommands: Record<string, Command> = {
  'keys rotate': {
    usage: 'orgauth keys rotate [--alg ES256|RS256|EdDSA]',
    summary:
      "make a new signing key of an algorithm active (SIGNING_ALG's, which signs access tokens, unless --alg names another: RS256 and ES256 sign ID tokens); older keys still verify until their tokens expire",
    options: { alg: { type: 'string' } },
    run: async ({ db, config }, v) => {
      const alg = optionalString(v, 'alg') ?? config.signingAlg;
      const inUse = activeAlgorithms(config.signingAlg);
      if (!(inUse as string[]).includes(alg)) throw new UsageError(`--alg must be one of the algorithms in use: ${inUse.join(', ')}`);
      const key = await rotateSigningKey(db, { alg: alg as SigningAlg, secretKey: config.secretKey });
      return { json: key, text: `new signing key ${key.kid} (${key.alg}) is active` };
    },
  },

  'keys list': {
    usage: 'orgauth keys list',
    summary: 'list the signing keys, newest first: active, retired (still verifying) or expired',
    options: {},
    run: async ({ db, config }) => {
      const keys = (await listSigningKeys(db, config)).map((k) => ({
        kid: k.kid,
        alg: k.alg,
        status: k.status,
        created_at: k.created_at.toISOString(),
        retired_at: k.retired_at?.toISOString() ?? null,
      }));
      return {
        json: { data: keys },
        text: table(['KID', 'ALG', 'STATUS', 'CREATED', 'RETIRED'], keys.map((k) => [k.kid, k.alg, k.status, k.created_at, k.retired_at ?? ''])),
      };
    },
  },
};
