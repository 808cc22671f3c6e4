#include "cli/calibration_text.h"

namespace recall::cli {
namespace {

constexpr char kText[] =
    R"(Once upon a time, in a small town by a wide green hill, there lived a girl named Mia. Mia had a red coat, a yellow hat and a little brown dog called Pip. Every morning Mia and Pip walked to the top of the hill to look at the sky. Some days the sky was blue and bright. Some days it was grey and full of rain. Mia liked both kinds of days, because on every day there was something new to see.

One morning Mia saw a big kite stuck in the old oak tree. The kite was green and orange, and it had a long tail made of ribbons. "Poor kite," said Mia. "It wants to fly, but the tree will not let it go." Pip barked at the tree, as if he could make it give the kite back. Mia laughed. "Barking will not help, Pip. We need a plan."

Mia thought and thought. She could not climb so high, and the branches were thin at the top. Then she saw a boy sitting on a bench near the tree. He looked sad. His name was Sam, and the kite was his. "My grandpa made that kite for me," Sam said. "Now it is stuck, and I cannot reach it." Mia sat down next to him. "We can try together," she said. "Two friends can do more than one."

Sam found a long stick by the fence. Mia held the bottom of the stick while Sam stood on a big rock and pushed the kite from below. The wind helped too. It blew softly, then harder, and the kite began to wiggle. Pip jumped and ran in circles. At last the kite slipped free and floated down into Sam's arms. Sam smiled a big smile. "Thank you, Mia! Thank you, Pip!" he said.

That afternoon the three of them flew the kite on top of the hill. It went up and up until it looked as small as a bird. Mia held the string for a while, and she felt the kite pull like a happy fish on a line. When the sun began to go down, Sam rolled up the string and said, "Will you come back tomorrow?" Mia nodded. "Every day," she said. And from that day on, Mia and Sam were the best of friends.

In the same town there was a bakery with a blue door. The baker was a kind old man named Mr. Brown. He made round bread, long bread, sweet buns with sugar on top and little cakes with cherries in the middle. The children of the town loved to stand by his window and smell the warm bread. Mr. Brown always waved at them, and sometimes he gave them a small bun to share.

One winter day, Mr. Brown hurt his arm. He could not lift the heavy trays or mix the thick dough. He sat in his chair and looked at the empty shelves. "What will the town eat tomorrow?" he asked his cat, Daisy. Daisy only purred. Mr. Brown sighed, because he did not want to let anyone down.

When Mia walked past the bakery and saw the dark window, she knew something was wrong. She knocked on the blue door. Mr. Brown told her about his arm. Mia ran to tell Sam, and Sam told his sister Lily, and Lily told her friend Ben. Soon there were five children in the bakery, all with clean hands and big aprons that were much too long for them.

Mr. Brown sat in his chair and told them what to do. "First the flour," he said. "Then the water, then a little salt, and some yeast to make the bread grow." The children mixed and poured and stirred. Flour went on the table, on the floor and on Ben's nose. Everyone laughed. Then they pushed and folded the dough, just as Mr. Brown showed them, until it was soft and smooth.

While the dough rested, Lily asked, "Why does bread need to wait?" Mr. Brown smiled. "Good things take time," he said. "The yeast is tiny and alive. It eats a little sugar and makes small bubbles, and the bubbles make the bread light and soft. If you rush it, the bread will be hard as a stone." The children looked at the bowl with new eyes. They had never known that bread was a little bit alive.

The next morning the shelves were full again. The bread was not as round as Mr. Brown's bread, and some of the buns were a bit too big, but the whole town said it was the best bread they had ever eaten. Mr. Brown was so proud that he gave every child a cake with a cherry in the middle. When his arm got better, he put a new sign in the window. It said: "Baked with help from the best bakers in town."

Far away from the town, at the edge of a deep forest, there lived a small owl named Olive. Olive was younger than the other owls, and she was afraid of the dark. This was a problem, because owls are supposed to love the night. When the moon came up, the other owls flew out to hunt and to sing, but Olive stayed in her hollow tree and covered her eyes with her wings.

Her mother was patient. "The dark is not empty," she told Olive. "It is full of things you cannot see yet. Your eyes are strong. Give them time." Olive wanted to believe her, but every shadow looked like a monster, and every sound made her jump. The wind in the leaves sounded like whispers. The creek sounded like footsteps.

One night, a little rabbit called Tom got lost near Olive's tree. He was crying, because he could not find his way home. Olive heard him. She peeked out of her hollow and saw him shaking in the grass. Olive was scared, but she was more sad for Tom than scared for herself. She took a deep breath and flew down to the ground.

"Do not cry," Olive said. "I will help you find your home." Tom looked up at her with wide eyes. "But it is so dark," he said. "How can you see?" Olive opened her big round eyes, and to her surprise she could see the path, the stones and the roots of the trees, all silver in the moonlight. Her mother had been right. The dark was not empty at all.

Olive led Tom along the path, past the big rock and across the little bridge over the creek. She told him about the stars, which looked like tiny lamps in the sky, and about the moon, which followed them like a friend. Tom stopped crying. He even began to hop and sing a little song. At last they came to a hole under a bush, and out jumped Tom's mother, who hugged him tight.

Olive flew home feeling warm inside. That night she did not hide in her tree. She sat on the highest branch and listened to the forest. She heard a frog singing by the water, a mouse running under the leaves and a fox calling to the moon. None of them were monsters. They were her neighbors. From then on, Olive loved the night, and the other owls said she had the best eyes in the whole forest.

Back in the town, summer came, and with it came the big fair. There were games, music, a tall wheel with colored seats, and a long table full of pies. Every year there was also a race down the river in small boats that the children built themselves. Mia and Sam decided to build a boat together. They called it The Happy Duck.

They made the boat out of old wood, a plastic bottle and a piece of cloth for the sail. Sam painted a yellow duck on the side. Mia tied the sail with string. Pip sat in the middle of the floor and watched every step, as if he were the captain. When they put the boat in a bucket of water to test it, it leaked. Water came in through a crack at the bottom. Mia frowned. "We cannot race a boat that sinks," she said.

They asked Grandpa for help, because he had made Sam's kite and he knew how to make many things. Grandpa looked at the crack and rubbed his chin. "Wood likes to drink water," he said. "When it drinks, it grows a little and the crack closes. But we can also help it." He showed them how to fill the crack with wax from an old candle. They melted the wax, pressed it into the crack and let it cool. This time, when they tested the boat, it did not leak at all.

On the day of the race, the river was bright and fast. There were ten boats in a line, each one different. One looked like a shoe, one looked like a fish, and one was just a big box with a flag. The mayor blew a whistle, and all the boats were pushed into the water. The children ran along the bank and cheered. The Happy Duck bobbed and turned, and for a moment it went the wrong way. Then the wind caught the little sail, and the boat shot forward.

The Happy Duck did not win. A boat shaped like a long green leaf came in first, and the box with the flag came in second. The Happy Duck was third. Mia thought Sam would be sad, but he was jumping up and down. "It floated!" he shouted. "It floated all the way!" Mia laughed, and she jumped too. They had made a boat with their own hands, and it had sailed down the whole river. That was better than any prize.

When autumn came, the leaves on the hill turned red and gold. Mia liked to collect the prettiest ones and press them in a big book. One day she found a leaf that was half red and half green, as if it could not decide what season it was. She showed it to her teacher, Miss Rose. Miss Rose held it up to the window. "Look," she said. "Leaves are green in summer because they are busy making food from the sun. In autumn they rest, and the green goes away, and the other colors that were hiding come out."

Mia thought that was wonderful. "So the red was there all the time?" she asked. "Some of it was," said Miss Rose. "It was just waiting for its turn." Mia looked at the leaf for a long time. She thought about Olive the owl, who had been brave all along, and about the bread that needed time to grow. Maybe many things were like that, she thought. Maybe the best parts of them were hiding, waiting for the right time to show.

That night, Mia told the story of the leaf to her little brother, Leo, before he went to sleep. Leo was only four, and he asked a hundred questions. "Do people have hidden colors too?" he asked. Mia smiled and tucked the blanket under his chin. "I think so," she said. "Some people are quiet, and then one day they help you, and you see how kind they are." Leo yawned. "I have a hidden color," he said. "It is purple." Then he closed his eyes and fell asleep.

The winter after that was very cold. Snow covered the hill, the bakery, the river and the forest. The children built a snowman with a carrot nose and a red scarf, and they went down the hill on wooden sleds. Pip loved the snow. He jumped into the deep parts and came out white from head to tail, and then he shook himself and covered everyone with snow. Mr. Brown made hot bread and sweet buns, and the whole town came to the bakery to get warm.

On the longest night of the year, the town had a party in the square. There were lights in every window and a big fire in the middle. Grandpa played an old song on his fiddle, and everyone danced, even Mr. Brown with his cat in his arms. Mia looked at all the faces in the warm light: Sam and Lily, Ben and Leo, Miss Rose and Grandpa. She thought about the kite and the bread and the boat, and about all the days on the hill.

"This is the best town in the world," she said to Pip. Pip wagged his tail, which Mia knew meant yes. Up in the dark sky, far above the fire, a small owl flew over the square and called out once, soft and clear. Mia waved. She did not know the owl's name, but she was sure it was a friend. And the stars shone down on the town all night long, until the sun came up and a new day began.
)";

}  // namespace

const char* DefaultCalibrationText() { return kText; }

}  // namespace recall::cli
