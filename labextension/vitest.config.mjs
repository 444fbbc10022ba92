import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['src/**/*.test.ts'],
    environment: 'node',
    // The golden report's types (src/*.test-d.ts) are checked by tsc on
    // every run: a field renamed in Go fails it.
    typecheck: { enabled: true, include: ['src/**/*.test-d.ts'], tsconfig: './tsconfig.test.json' }
  }
});
