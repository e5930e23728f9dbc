#include <stdio.h>
#include "bad.h"

int main(void) {
    int unused = 3;
    puts(42);
    return missing;
}
