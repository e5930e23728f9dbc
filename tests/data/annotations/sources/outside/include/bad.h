/* A header outside the repository, with an error of its own. */
static int broken_header(void) { return undeclared_in_header; }
