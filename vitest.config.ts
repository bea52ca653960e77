import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['actors/**/*.test.ts', 'bridge/**/*.test.ts', 'cluster/**/*.test.ts', 'recipes/**/*.test.ts', 'test/**/*.test.ts'],
    // Integration tests start real processes, Ray and torch on a 2-core machine: run files one at a
    // time so they do not starve each other, and give them room.
    fileParallelism: false,
    testTimeout: 120_000,
    hookTimeout: 180_000,
    reporters: ['default'],
  },
});
