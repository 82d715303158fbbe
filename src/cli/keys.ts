import { listSigningKeys, rotateSigningKey } from '../oauth/models/signing-keys.js';
import { table, type Command } from './shared.js';

export const keyCommands: Record<string, Command> = {
  'keys rotate': {
    usage: 'orgauth keys rotate',
    summary: 'make a new signing key (SIGNING_ALG) active; older keys still verify until their tokens expire',
    options: {},
    run: async ({ db, config }) => {
      const key = await rotateSigningKey(db, { alg: config.signingAlg, secretKey: config.secretKey });
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
