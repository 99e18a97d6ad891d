/* sbx-agent: a thin main over agent_main() (agent.c). */
#include "config.h"

#include "agent_i.h"

int main(int argc, char **argv)
{
	return agent_main(argc, argv);
}
