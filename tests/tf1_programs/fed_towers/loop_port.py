"""The Keras 3 port of train_tf1.py with a custom loop: strategy.run inside a tf.function, each
replica's rows cut by the port itself (experimental_distribute_values_from_function).

    python loop_port.py --data_dir DIR --num_gpus 2 --batch_size 16
"""
import argparse
import os

import keras
import numpy as np
import tensorflow as tf

from modern.runtime import configure_devices, make_strategy

parser = argparse.ArgumentParser()
parser.add_argument("--data_dir", default="/tmp/fed_towers_data")
parser.add_argument("--train_dir", default="/tmp/fed_towers_train_loop")
parser.add_argument("--num_gpus", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=64, help="global batch")
parser.add_argument("--learning_rate", type=float, default=0.1)
parser.add_argument("--hidden", type=int, default=32)
parser.add_argument("--max_steps", type=int, default=100)


def main() -> None:
    args = parser.parse_args()
    configure_devices(args.num_gpus)
    strategy = make_strategy(args.num_gpus)
    data = np.load(os.path.join(args.data_dir, "train.npz"))
    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(args.hidden, activation="relu", name="hidden"),
                                  keras.layers.Dense(10, name="logits")])
        optimizer = keras.optimizers.SGD(args.learning_rate)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_row = tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x, training=True))
            rows = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.shape(y)[0])
            loss = tf.nn.compute_average_loss(per_row, global_batch_size=rows)  # the step's rows: a short batch too
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(element):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=element), axis=None)

    share = args.batch_size // args.num_gpus
    for step in range(args.max_steps):
        start = step * args.batch_size % (len(data["images"]) - args.batch_size + 1)

        def rows(context, start=start):
            k = start + context.replica_id_in_sync_group * share
            return data["images"][k:k + share], data["labels"][k:k + share]
        loss = train_step(strategy.experimental_distribute_values_from_function(rows))
        print(f"step {step}, loss {float(loss):.3f}")


if __name__ == "__main__":
    main()
