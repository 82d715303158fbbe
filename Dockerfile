# syntax=docker/dockerfile:1
# orgauth: build with the dev dependencies, run with production ones only.
# Node 22 (LTS): orgauth supports Node >= 20.19; the image uses the newer line.

FROM node:22-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json .npmrc ./
# --ignore-scripts: `prepare` (the build) needs the sources, copied below; argon2 ships prebuilt binaries.
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY scripts ./scripts
COPY migrations ./migrations
RUN npm run build && npm prune --omit=dev --ignore-scripts

FROM node:22-bookworm-slim
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=3000 \
    DATA_DIR=/data
WORKDIR /app
COPY --from=build /app/package.json /app/package-lock.json ./
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY bin ./bin
# `orgauth ...` and `npx orgauth ...` both work in the container.
RUN ln -s /app/bin/orgauth.js /usr/local/bin/orgauth \
    && mkdir -p /data && chown node:node /data
USER node
VOLUME ["/data"]
EXPOSE 3000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.PORT||3000)+'/readyz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
# Migrations run at start; SIGTERM closes gracefully (server.ts handles it from its first line).
CMD ["node", "dist/bundle/server.js"]
