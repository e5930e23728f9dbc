module.exports = [
  {
    files: ["js/**/*.js"],
    languageOptions: { sourceType: "commonjs", globals: { console: "readonly" } },
    rules: {
      "no-unused-vars": "error",
      "no-undef": "error",
      "eqeqeq": "warn",
    },
  },
];
