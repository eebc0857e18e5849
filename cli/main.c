/* main.c - the kvchat command line: dispatches to one command per file. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvchat: not yet\n");
    return 1;
}
